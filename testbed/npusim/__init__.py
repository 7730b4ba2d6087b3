"""Simulated `npu-smi` and `hccn_tool` for the test bed's hosts.

Installed on every test host as /usr/local/bin/npu-smi,
/usr/local/Ascend/driver/tools/hccn_tool and /usr/local/bin/hccn_tool
(inside the host's own mount namespace), run by /usr/bin/python3. They print the
formats an Atlas 800 A3 node prints for 16 logical NPUs (see `formats`).

Files on each host (private to it):

* /etc/npu-sim/bed.json    read-only map of every host's NPU addresses (same on all hosts)
* /etc/npu-sim/faults.json this host's injected faults; absent or `{}` = healthy
* /etc/hccn.conf           address_N / netmask_N / netdetect_N / gateway_N for N in 0..15

Fault schema (every key optional; NPU ids are logical ids 0..15):

    {
      "link_down":    [3],                      # `-link -g` says DOWN; pings from/to it fail
      "net_health":   [5] or {"5": "Fault"},    # `-net_health -g` value (default "Fault")
      "tls_switch":   1 or {"2": 1},            # `-tls -g` switch on every / some NPUs
      "ping_loss":    ["node2", "10.213.64.12"] # peers (host name or NPU IP) unreachable
                      or {"node2": 0.34},       # ... or the share of packets lost
      "missing_npus": [15],                     # not listed by npu-smi; `-i 15` fails
      "health":       {"3": "Critical"},        # npu-smi info Health column
      "hccn_exclusive_s": 0.05,                 # hccn_tool holds the device this long per call and answers a
                                                # call meanwhile `hccn_tool is busy, please try again.` (rc 1)
      "no_roce": true                           # an HCCS-only site: -ip -g says `Get ipconf failed, because no ip
    }                                           # was preset there!`; -netdetect, -gateway, -ping fail (rc 1)

A ping to another host's NPU also fails when that host's faults mark the target
NPU missing or its link down (peers' faults files are read through the bed map), and
when that host's `ping_loss` names this host or the sending NPU's address: the replies
are lost on the way back, as on a real lossy path.
Only get (`-g`) operations are simulated; set operations exit with code 2.
"""
