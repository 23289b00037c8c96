"""The test harness that tests and benchmarks share (never part of the product).

- ``net``: free ports, ``wait_until`` / ``wait_listening`` (conditions, not sleeps), loopback
  iperf3 servers, a black-hole namespace, stopping by process group.
- ``pg``: private PostgreSQL clusters; ``sshd``: private OpenSSH servers; ``agent``: real
  ``iepm agent`` processes; ``xrootd_plain``, ``slowdisk``, ``faults``: servers and failures.
- ``copylab``, ``labtools``: what lab tests share (``iepm.lab.testing`` builds the labs).
- ``sample``, ``flow_encoder``, ``outputs``: data in the shapes the real writers produce.

Tiers (markers, set in ``tests/conftest.py``): fast (no marker), ``servers`` (real servers on
loopback), ``lab`` (network namespaces, root), ``browser`` (chromium). ``make test-fast`` runs
the first in parallel.
"""
