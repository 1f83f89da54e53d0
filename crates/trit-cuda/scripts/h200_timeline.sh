#!/bin/bash
# The real timeline of graph-replayed 8B decode (session 8): nsys with graph nodes traced,
# then, for one step, each kernel kind's count and summed duration, and 16 consecutive kernels
# with their start, end and overlap. The machine's nsys sits in Nsight Compute's folder and
# its QdstrmImporter needs libdw.so.1, libelf.so.1, libbz2.so.1.0 and liblzma.so.5, which the
# machine lacks: copy them from this Debian machine into $G/lib and carry $G.
# Usage: G=.dev/gpu/DIR (bins.tar.xz as h200_final.sh expects, plus lib/); SKIP="60 -1" prints
# the 16 kernels from the step's 60th and those around the step boundary, from one trace.
# TRACE=graph traces each graph as one item (the launch costs less under the tracer).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p /tmp/bin /tmp/models; tar -xJf "${G:?}/bins.tar.xz" -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}; export TRIT_CUDA_CACHE=/tmp/tc
NS=$(find / -name nsys -type f -perm -u+x 2>/dev/null | head -1)
IMP=$(find / -name QdstrmImporter -type f 2>/dev/null | head -1)
M=${MODEL:-8b}
/tmp/bin/gen_model --preset $M --out /tmp/models/$M --formats q2_0 > /dev/null 2>&1
timeout 150 $NS profile --cuda-graph-trace=${TRACE:-node} -t cuda -o /tmp/ns -f true /tmp/bin/trit bench --device cuda -m /tmp/models/$M/model-q2_0.gguf -p 0 -n 24 -r 1 > /tmp/ns.log 2>&1
LD_LIBRARY_PATH=$PWD/$G/lib:$LD_LIBRARY_PATH $IMP -i /tmp/ns.qdstrm > /tmp/imp.log 2>&1 || tail -3 /tmp/imp.log
$NS stats --report cuda_gpu_trace,cuda_api_trace --format csv -o /tmp/tr /tmp/ns.nsys-rep > /dev/null 2>&1
# The host between two decode steps: every driver call from one graph launch to the next (start
# relative to the first launch, duration), and the copies the GPU ran in that window.
python3 - /tmp/tr_cuda_api_trace.csv /tmp/tr_cuda_gpu_trace.csv <<'PY'
import csv, sys
api = list(csv.DictReader(open(sys.argv[1])))
gpu = list(csv.DictReader(open(sys.argv[2])))
st = lambda r: int(r['Start (ns)'])
du = lambda r: int(r['Duration (ns)'])
launches = [i for i, r in enumerate(api) if 'GraphLaunch' in r['Name']]
if len(launches) < 3:
    print('fewer than 3 graph launches traced'); sys.exit()
a, b = launches[-3], launches[-2]
t0 = st(api[a])
print(f'host: launch to launch {(st(api[b]) - t0) / 1000:.1f} us')
pe = t0
for r in api[a:b + 1]:
    s = st(r)
    print(f"  {r['Name'][:34]:34s} at {(s - t0) / 1000:8.2f} took {du(r) / 1000:7.2f} (host gap before {(s - pe) / 1000:6.2f})")
    pe = s + du(r)
for r in gpu:
    if ('[CUDA' in r['Name'] or 'raph' in r['Name']) and t0 <= st(r) <= st(api[b]):
        print(f"  GPU {r['Name'][:30]:30s} at {(st(r) - t0) / 1000:8.2f} took {du(r) / 1000:7.2f} bytes {r.get('Bytes (MB)', r.get('Bytes', '?'))}")
PY
for skip in ${SKIP:-60}; do python3 - /tmp/tr_cuda_gpu_trace.csv "$skip" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
ks = [r for r in rows if r.get('Name') and '[CUDA' not in r['Name']]
st = lambda r: int(r['Start (ns)'])
du = lambda r: int(r['Duration (ns)'])
ends = [i for i, r in enumerate(ks) if r['Name'].startswith('advance_position')]
a, b = ends[-3], ends[-2]
print(f'one step: {(st(ks[b]) - st(ks[a])) / 1000:.1f} us, {b - a} kernels')
agg = collections.OrderedDict()
for r in ks[a + 1:b + 1]:
    k = r['Name'].split('(')[0][:40]
    agg.setdefault(k, [0, 0])
    agg[k][0] += 1
    agg[k][1] += du(r)
for k, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f'  {k:40s} x{c:4d} sum {t / 1000:8.1f} us  avg {t / c / 1000:6.2f}')
# SKIP < 0: the kernels around the step boundary (last layer, head, advance_position, the
# next step's first kernels), where any gap is host time between graph launches.
k0 = b - 6 if int(sys.argv[2]) < 0 else a + 1 + int(sys.argv[2])
w = ks[k0:k0 + 16]
t0, pe = st(w[0]), None
for r in w:
    s = st(r) - t0
    e = s + du(r)
    gap = '' if pe is None else f' after the previous end {(e - pe) / 1000:+.2f}, idle before {(s - pe) / 1000:+.2f}'
    print(f"  {r['Name'][:40]:40s} start {s / 1000:7.2f} end {e / 1000:7.2f}{gap}")
    pe = e
PY
done
