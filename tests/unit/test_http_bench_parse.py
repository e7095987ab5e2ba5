"""load/http_bench.py reads wrk's latency distribution from its own lines."""
from __future__ import annotations

from load.http_bench import percentile

WRK = """Running 1s test @ http://127.0.0.1:1234
  2 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   745.13us  391.65us  12.40ms   92.50%
    Req/Sec     1.34k   120.00     1.50k    99.00%
  Latency Distribution
     50%  680.00us
     75%  800.00us
     90%    1.00ms
     99%    2.00ms
  2656 requests in 1.00s, 682.36KB read
"""


def test_the_percentiles_come_from_the_distribution_not_the_stdev_column():
    # "92.50%" and "99.00%" in the Thread Stats lines once made the 50% and 99% reads fail
    assert percentile(WRK, 50) == 0.68
    assert percentile(WRK, 99) == 2.0
