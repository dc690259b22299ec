"""Adapters between castore and agent frameworks: Pi (``pi``), LangGraph, ADK, OpenAI Agents.

Each adapter is imported on its own (``from castore.adapters import pi``); this package
imports nothing, so that optional dependencies stay optional and ``import castore`` fast.
"""
