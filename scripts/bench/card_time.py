#!/usr/bin/python3
"""Where a card's time goes while a command runs: reads a ttd's /metrics before and after
the command and prints, per device call, the waiting, running and answering phases, the
time of each op's nodes (forward and backward) and of the optimizer's updates, and what of
the running phase is neither (copies, checks, the method's own work).

  scripts/bench/card_time.py ADMIN_HOST:PORT -- COMMAND...
  scripts/bench/card_time.py 127.0.0.1:9464 -- build/bin/bench_step_ab --a unix:S --b unix:S --batch 64

The figures are the daemon's counters (docs/operations.md, "Metrics"): whatever else runs
on the ttd meanwhile is counted too."""
import re
import subprocess
import sys
import urllib.request

SAMPLE = re.compile(r'^(ttd_(?:node_seconds_total|node_runs_total|optimizer_seconds_total|optimizer_updates_total|'
                    r'device_call_seconds_total|device_calls_total))(\{[^}]*\})? (\S+)$')


def scrape(admin):
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    admin, command = sys.argv[1], sys.argv[3:]
    before = scrape(admin)
    rc = subprocess.call(command)
    after = scrape(admin)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    calls = delta.get(("ttd_device_calls_total", ""), 0)
    if calls <= 0:
        sys.exit(f"card_time: no device call ran on the ttd at {admin} (command exit {rc})")

    def us(key):
        return delta.get(key, 0.0) * 1e6 / calls

    print(f"card_time: {calls:.0f} device calls; per call, in us:")
    for phase in ("waiting", "running", "answering"):
        key = ("ttd_device_call_seconds_total", '{phase="%s"}' % phase)
        print(f"  {phase:<10} {us(key):9.1f}")
    inside = 0.0
    for (name, labels), seconds in sorted(delta.items()):
        if name != "ttd_node_seconds_total" or seconds <= 0:
            continue
        runs = delta.get(("ttd_node_runs_total", labels), 0)
        what = labels.strip("{}").replace('"', "")
        print(f"    {what:<28} {us((name, labels)):9.1f}  ({runs / calls:.1f} nodes)")
        inside += us((name, labels))
    optimizer = us(("ttd_optimizer_seconds_total", ""))
    updates = delta.get(("ttd_optimizer_updates_total", ""), 0)
    print(f"    {'optimizer updates':<28} {optimizer:9.1f}  ({updates / calls:.1f} updates)")
    running = us(("ttd_device_call_seconds_total", '{phase="running"}'))
    print(f"    {'the rest of running':<28} {running - inside - optimizer:9.1f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
