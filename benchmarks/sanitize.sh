#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over fullfuse's own kernels: both fused kernels and both fallback
# epilogues at the seed shapes (N = 2) and three odd shapes each (benchmarks/sanitize_cases.py --list).
#
#   benchmarks/sanitize.sh                  # every tool x every case
#   benchmarks/sanitize.sh fusedA_seed ...  # these cases only
#   ONE_PROCESS=1 benchmarks/sanitize.sh    # per tool, all cases in one process (one sanitizer start: much faster;
#                                           # reports still name their kernel, the log names each case served)
#
# Environment: OUT (logs; default /tmp/out), TOOLS (default "memcheck racecheck synccheck"), JOBS (sanitized processes
# at once on the GPU; default 4), TIMEOUT_S (per run; default 300), SANITIZER (default compute-sanitizer on the PATH or
# in $CUDA_HOME/bin), SANITIZER_ARGS (extra options, e.g. a kernel filter).  FULLFUSE_CUDNN_FRONTEND defaults to 0
# here: the fallback's convolution is then PyTorch's own cuDNN call, not the frontend's timing of every plan (hundreds
# of launches under the sanitizer, none of them fullfuse's).
#
# Writes one log per tool and case, $OUT/sanitize_<tool>_<case>.log, and prints one line per run: tool, case, the
# sanitizer's "ERROR SUMMARY: n errors" (racecheck: "RACECHECK SUMMARY: n hazards ..."), the reports inside fullfuse's
# kernels, and apart from them the reports inside other kernels (cuDNN, PyTorch).  Exit status 1 when any report is in
# a fullfuse kernel or a case failed.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
TOOLS=${TOOLS:-memcheck racecheck synccheck}
JOBS=${JOBS:-4}
TIMEOUT_S=${TIMEOUT_S:-300}
export FULLFUSE_CUDNN_FRONTEND=${FULLFUSE_CUDNN_FRONTEND:-0}
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")}
export OUT SANITIZER TIMEOUT_S SANITIZER_ARGS=${SANITIZER_ARGS:-}
mkdir -p "$OUT"

if [ ! -x "$SANITIZER" ]; then
    echo "sanitize.sh: compute-sanitizer not found (set SANITIZER or CUDA_HOME)" >&2
    exit 2
fi
if [ $# -gt 0 ]; then CASES=("$@"); else mapfile -t CASES < <(python3 benchmarks/sanitize_cases.py --list); fi

# build / load the kernel libraries once, outside the sanitizer (a compile under it would take minutes)
python3 benchmarks/sanitize_cases.py --warm > "$OUT/sanitize_warm.log" 2>&1 || {
    echo "sanitize.sh: warm-up failed, see $OUT/sanitize_warm.log" >&2; tail -20 "$OUT/sanitize_warm.log" >&2; exit 2; }

run_one() {
    local tool=$1 case=$2 log="$OUT/sanitize_$1_$2.log"
    local args=(--tool "$tool" --show-backtrace device --print-limit 200)
    local env=()
    case "$tool" in
        racecheck) args+=(--racecheck-report hazard) ;;
        memcheck) args+=(--leak-check no); env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;  # exact allocations: OOB shows
    esac
    # shellcheck disable=SC2086
    env "${env[@]}" timeout "$TIMEOUT_S" "$SANITIZER" "${args[@]}" $SANITIZER_ARGS \
        python3 benchmarks/sanitize_cases.py "$case" > "$log" 2>&1
    echo "exit status $?" >> "$log"
}
export -f run_one

start=$(date +%s)
if [ "${ONE_PROCESS:-0}" = 1 ]; then
    for tool in $TOOLS; do
        log="$OUT/sanitize_${tool}_all.log"
        env $([ "$tool" = memcheck ] && echo PYTORCH_NO_CUDA_MEMORY_CACHING=1) timeout "$TIMEOUT_S" "$SANITIZER" \
            --tool "$tool" --show-backtrace device --print-limit 200 \
            $([ "$tool" = racecheck ] && echo --racecheck-report hazard) \
            $([ "$tool" = memcheck ] && echo --leak-check no) \
            $SANITIZER_ARGS python3 benchmarks/sanitize_cases.py "${CASES[@]}" > "$log" 2>&1 &
    done
    wait
    status=0
    for tool in $TOOLS; do
        log="$OUT/sanitize_${tool}_all.log"
        python3 benchmarks/sanitize_cases.py --summarize "$tool" all "$log" | tee -a "$OUT/sanitize_summary.txt"
        grep -E "^[a-zA-Z0-9_]+: (fused|fallback|torch|NOT SERVED)" "$log" | sed "s/^/    /" \
            | tee -a "$OUT/sanitize_summary.txt"
        python3 benchmarks/sanitize_cases.py --summarize "$tool" all "$log" | grep -q "fullfuse kernels: 0 " || status=1
    done
    echo "sanitize.sh: $(( $(date +%s) - start )) s, logs in $OUT"
    exit $status
fi
for tool in $TOOLS; do
    for case in "${CASES[@]}"; do
        printf '%s %s\n' "$tool" "$case"
    done
done | xargs -P "$JOBS" -n 2 bash -c 'run_one "$@"' _

status=0
for tool in $TOOLS; do
    for case in "${CASES[@]}"; do
        log="$OUT/sanitize_${tool}_${case}.log"
        line=$(python3 benchmarks/sanitize_cases.py --summarize "$tool" "$case" "$log")
        rc=$(sed -n 's/^exit status //p' "$log" | tail -1)
        served=$(grep -E "^${case}: " "$log" | tail -1 | cut -c1-100)
        echo "$line | exit ${rc:-?} | ${served:-no case output}"
        case "$line" in *"fullfuse kernels: 0 "*) ;; *) status=1 ;; esac
        [ "${rc:-1}" = 0 ] || status=1
    done
done
echo "sanitize.sh: $(( $(date +%s) - start )) s, logs in $OUT"
exit $status
