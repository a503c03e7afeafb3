#!/usr/bin/env bash
# Time one make target (test or repro) in this checkout and record its wall time in
# results/timings.json, which `fp4repro docs` renders into the README. Run it on a fresh clone
# (git clone . /tmp/check && cd /tmp/check && scripts/time_make.sh test), then copy the file back.
#
# Usage: scripts/time_make.sh TARGET
set -uo pipefail
target=${1:?usage: scripts/time_make.sh test|repro}
cd "$(dirname "$0")/.."
start=$(date +%s.%N)
make "$target"
status=$?
end=$(date +%s.%N)
if [ $status -ne 0 ]; then
    echo "make $target failed (exit $status): nothing recorded" >&2
    exit $status
fi
python3 - "$target" "$start" "$end" <<'PY'
import json, os, platform, subprocess, sys, tempfile
target, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
path = "results/timings.json"
timings = json.load(open(path)) if os.path.exists(path) else {}
cores = os.cpu_count()
memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
timings[target] = {
    "seconds": round(end - start, 1),
    "machine": f"{cores} cores, {memory:.0f} GiB, {platform.machine()}" + ("" if os.path.exists("/dev/nvidia0") else ", no GPU"),
    "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
}
fd, tmp = tempfile.mkstemp(dir="results")
with os.fdopen(fd, "w") as f:
    json.dump(timings, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print(f"make {target}: {end - start:.0f} s, recorded in {path}")
PY
