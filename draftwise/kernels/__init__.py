"""draftwise's C++ CPU kernels: the sources (``csrc/``, one folder per concern), their build for
this machine (``native.py``) and what identifies the CPU they were built and measured on
(``cpu_info.py``). The lowest layer of the package: it imports nothing else of draftwise."""
