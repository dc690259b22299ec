"""The benchmark suite behind ``scripts/bench``: castore against the stores users would otherwise pick.

Modules (each small, none imported by castore itself):

* :mod:`.workload` - the shared workload: ~500-byte messages, a state delta per step;
* :mod:`.fsize` - bytes stored and disk usage of files and folders;
* :mod:`.count` - a Storage wrapper counting S3 requests and sequential round trips
  (imported by cold-read children too, so it stays tiny);
* :mod:`.systems` - castore local, Pi's JSONL model, the floor;
* :mod:`.lg` - LangGraph InMemorySaver, SqliteSaver, DeltaChannel on SqliteSaver;
* :mod:`.s3` - castore on S3 through moto with added latency;
* :mod:`.cold` - cold reads in fresh processes;
* :mod:`.machine` - machine, versions and load;
* :mod:`.report` - docs/benchmarks/BENCHMARKS.md and the targets;
* :mod:`.__main__` - the command line and the schedule (systems alternated in every round).
"""
