#!/usr/bin/env bash
# One device call (see benchmarks/NOTES.md): install the carried wheels, then run the given stages; every log and
# result lands in $OUT.  Usage: benchmarks/device_run.sh STAGE... with STAGE in
#   tests  tests-all  tests-a  bench-3d  general-a  general-a-grid  general-a-quick  general-a-rgb  general-a-s2  general-a-s2-narrow  general-a-r2  general-a-pairs  general-a-line-c16  seed-a  ab-a  diag-h2  micro-a  fixed-a  clock-a  bench-bigc  probe  probe-a  probe-b  profile-a  ncu-a16  ncu-a-sass  profile-b  host-b  variance-b  probe-chunks  bench-b  check  bench-quick  bench-full  bench-dtypes  final  final-a  final-b
set -uo pipefail
export PYTHONUNBUFFERED=1 FULLFUSE_CACHE_DIR="$PWD/.ffcache"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD"
ff() { python3 -m fullfuse.cli "$@"; }
pack() { (cd "$OUT/r" && tar czf "$OUT/results-$stage.tgz" .); }   # a final stage's results so far, one archive per stage
ff info 2>&1 | tee "$OUT/info.txt"
[ "${FF_BUILD:-1}" = 1 ] && ff build 2>&1 | tail -5   # FF_BUILD=0: use only what was carried (no device compile time)
rc=0
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case "$stage" in
    tests) python3 -m pytest -q -x --timeout=900 -p no:cacheprovider tests 2>&1 | tee "$OUT/tests.txt" | tail -40; rc=$((rc | ${PIPESTATUS[0]})) ;;
    tests-all) python3 -m pytest -q --timeout=900 -p no:cacheprovider tests 2>&1 | tee "$OUT/tests.txt" | tail -60; rc=$((rc | ${PIPESTATUS[0]})) ;;   # every failure, not the first
    tests-a) python3 -m pytest -q -x --timeout=900 -p no:cacheprovider tests/test_gpu.py -k "A: or fused_a or seed_models or gelu" 2>&1 | tee "$OUT/tests_a.txt" | tail -15; rc=$((rc | ${PIPESTATUS[0]})) ;;
    clock-a)   # SM clock / power while the fused A kernel runs; the wgmma + ALU overlap microbenchmark (carried binary .carry/pw)
      FF_FUSED_A_SO=$(python3 -c "from cutlass_ops.builder import library_path; print(library_path('fused_conv_act_pool'))") \
        python3 benchmarks/probe_clock_a.py 2>&1 | tee "$OUT/probe_clock_a.txt"
      if [ -x .carry/pw ]; then PW_OVERLAP_ONLY=1 .carry/pw 2>&1 | tee "$OUT/probe_overlap.txt"; fi ;;
    fixed-a)   # the fused A kernel's fixed cost per call: time vs N flushed / unflushed / code re-warmed, and ncu's kernel-only durations
      export FF_FUSED_A_SO=$(python3 -c "from cutlass_ops.builder import library_path; print(library_path('fused_conv_act_pool'))")
      (cd benchmarks && python3 probe_fixed_a.py 2>&1 | tee "$OUT/probe_fixed_a.txt")
      for cc in all none; do
        (cd benchmarks && FF_FIXED_NCU=1 ncu --clock-control none --cache-control $cc -k regex:fa_wgmma --metrics gpu__time_duration.sum \
          python3 probe_fixed_a.py > "$OUT/ncu_fixed_a_cache_$cc.txt" 2>&1); grep -c duration "$OUT/ncu_fixed_a_cache_$cc.txt"
      done ;;
    ab-a)   # fused A builds side by side in one process: FF_AB_LIBS="name=path,..." (carried), then this build as "new"
      new=$(python3 -c "from cutlass_ops.builder import library_path; print(library_path('fused_conv_act_pool'))")
      FF_AB_LIBS="${FF_AB_LIBS:+$FF_AB_LIBS,}new=$new" python3 benchmarks/probe_ab_a.py 2>&1 | tee "$OUT/probe_ab_a.txt" ;;
    diag-h2)   # the kernel's 16-bit GELU value by value against its fp16 emulation (tests/test_gelu_h2.py)
      FF_FUSED_A_SO=$(python3 -c "from cutlass_ops.builder import library_path; print(library_path('fused_conv_act_pool'))") \
        python3 benchmarks/diag_gelu_h2.py 2>&1 | tee "$OUT/diag_gelu_h2.txt" ;;
    micro-a)   # the load-free microbenchmarks (carried binaries .carry/pe, .carry/pw: probe_epilogue_a.cu, probe_wgmma_smem.cu)
      .carry/pe 2>&1 | tee "$OUT/probe_epilogue_a.txt"
      PW_OVERLAP_ONLY=1 PW_OVERLAP_NEW=1 .carry/pw 2>&1 | tee "$OUT/probe_overlap.txt" ;;
    probe) python3 benchmarks/probe_convt.py 2>&1 | tee "$OUT/probe_convt.txt" ;;
    probe-a)   # fused family-A kernel straight through ctypes: checks + seed timings, knob variants in child processes
      FF_FUSED_A_SO=$(python3 -c "from cutlass_ops.builder import library_path; print(library_path('fused_conv_act_pool'))") \
        FF_PROBE_QUICK=1 FF_PROBE_VARIANTS="${FF_PROBE_VARIANTS:-}" python3 benchmarks/probe_fused_a.py 2>&1 | tee "$OUT/probe_fused_a.txt" ;;
    probe-b)   # fused family-B kernel straight through ctypes: every check case, seed timings; FF_PROBE_VARIANTS (prebuilt
      # into FF_PROBE_SO_DIR, carried) and FF_PROBE_DTYPES pass through
      python3 benchmarks/probe_fused_b.py 2>&1 | grep -v "^ptxas" | tee "$OUT/probe_fused_b.txt" ;;
    profile-a)   # product-path timing (eager vs CUDA graph) and Nsight Compute on the fused family-A kernel
      python3 benchmarks/profile_fused_a.py time 2>&1 | tee "$OUT/profile_a_time.txt"
      ncu --clock-control none -k regex:"fa_(wgmma|ws)" --launch-skip 2 --launch-count 2 --import-source no \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
        --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
        python3 benchmarks/profile_fused_a.py ncu > "$OUT/ncu_a.txt" 2>&1; tail -5 "$OUT/ncu_a.txt"
      ncu --clock-control none -k regex:"fa_(wgmma|ws)" --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
        --page source --csv --print-source sass python3 benchmarks/profile_fused_a.py ncu > "$OUT/ncu_a_sass.csv" 2>&1
      gzip -f "$OUT/ncu_a_sass.csv"; ls -la "$OUT" ;;
    ncu-a16)   # Nsight Compute on the fused family-A kernel with bf16 input (the half-precision epilogue): stalls and pipe use
      ncu --clock-control none -k regex:fa_wgmma --launch-skip 2 --launch-count 2 --import-source no \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
        --section InstructionStats --section MemoryWorkloadAnalysis --section Occupancy \
        --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active \
        python3 benchmarks/profile_fused_a.py ncu bf16 > "$OUT/ncu_a_bf16.txt" 2>&1; tail -5 "$OUT/ncu_a_bf16.txt" ;;
    ncu-a-sass)   # Nsight Compute per SASS instruction (executed counts, stall samples) of the fused A kernel at the seed:
      # bf16 channels_last, bf16 NCHW, TF32 NCHW (profile_fused_a.py runs 3 calls per layout, channels_last first)
      for spec in "bf16 2 nhwc" "bf16 3 nchw" "tf32 3 nchw"; do
        read -r dt skip lay <<< "$spec"
        ncu --clock-control none -k regex:fa_wgmma --launch-skip "$skip" --launch-count 1 --section SourceCounters \
          --section WarpStateStats --page source --csv --print-source sass python3 benchmarks/profile_fused_a.py ncu "$dt" \
          > "$OUT/ncu_a_sass_${dt}_$lay.csv" 2>&1
        gzip -f "$OUT/ncu_a_sass_${dt}_$lay.csv"
      done; ls -la "$OUT" ;;
    profile-b)   # Nsight Compute on the fused family-B kernel at the seed (probe, FF_PROBE_NCU=1: channels_last launch first)
      for d in float32 bfloat16; do
        FF_PROBE_NCU=1 FF_PROBE_DTYPES=$d ncu --clock-control none -k regex:fb_kernel --launch-count 1 --import-source no \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
          --section InstructionStats --section MemoryWorkloadAnalysis python3 benchmarks/probe_fused_b.py > "$OUT/ncu_b_$d.txt" 2>&1
        FF_PROBE_NCU=1 FF_PROBE_DTYPES=$d ncu --clock-control none -k regex:fb_kernel --launch-count 1 --section SourceCounters \
          --section WarpStateStats --page source --csv --print-source sass python3 benchmarks/probe_fused_b.py > "$OUT/ncu_b_sass_$d.csv" 2>&1
        gzip -f "$OUT/ncu_b_sass_$d.csv"; tail -3 "$OUT/ncu_b_$d.txt"
      done ;;
    host-b) python3 benchmarks/profile_host_b.py 2>&1 | tee "$OUT/profile_host_b.txt" | head -40 ;;
    variance-b) python3 benchmarks/probe_variance_b.py 2>&1 | tee "$OUT/variance_b.txt" ;;
    probe-chunks) python3 benchmarks/probe_fallback_chunks.py 2>&1 | tee "$OUT/probe_chunks.txt" ;;
    check) ff check 2>&1 | tail -60 > "$OUT/check.txt"; tail -3 "$OUT/check.txt" ;;
    bench-bigc)   # family A with more input channels than the 3x3 straight-line kernels take (the general op chain)
      for c in 16 24 32; do for d in float32 bfloat16; do
        ff bench --family A --shape 32,$c,256,256 --dtype $d --variants eager fallback fused --layout channels_last --repeats 10 --out "$OUT" 2>&1 | tail -4
      done; done ;;
    bench-3d)   # family A's Conv3d form (Conv3d(C -> 64, k3) -> GELU -> global mean), both layouts
      for s in 8,2,64,128,128 4,4,64,128,128 8,1,96,96,96; do
        ff bench --family A --shape $s --variants eager compile fallback fused --layout both --repeats 20 --out "$OUT" --tag conv3d 2>&1 | tail -4
        ff bench --family A --shape $s --dtype bfloat16 --variants eager fallback fused --layout both --repeats 20 --out "$OUT" --tag conv3d 2>&1 | tail -3
      done ;;
    general-a)   # family A beyond the seed: fused vs fallback vs eager over common Conv2d shapes (benchmarks/general_a.py)
      python3 benchmarks/general_a.py --out "$OUT" 2>&1 | tee "$OUT/general_a.txt" | tail -40
      python3 benchmarks/general_a.py --quick --modes float32:ieee --out "$OUT" 2>&1 | tee "$OUT/general_a_ieee.txt" | tail -8
      FF_FUSED_A_IMPL=1 python3 benchmarks/general_a.py --quick --modes float32:auto float32:ieee bfloat16:auto --tag mma_sync_only \
        --out "$OUT" 2>&1 | tee "$OUT/general_a_mma_sync_only.txt" | tail -10 ;;
    general-a-grid)   # the whole grid once (TF32 and bf16, both layouts), nothing else
      python3 benchmarks/general_a.py --out "$OUT" 2>&1 | tee "$OUT/general_a.txt" | tail -40 ;;
    general-a-quick)   # the grid's four quick shapes (seed conv, 128 channels, 62- and 30-pixel rows) in TF32, ieee and bf16
      python3 benchmarks/general_a.py --quick --modes float32:auto float32:ieee bfloat16:auto --out "$OUT" 2>&1 \
        | tee "$OUT/general_a_quick.txt" | tail -14 ;;
    general-a-s2)   # the grid's stride-2 rows, then the same forced onto the mma.sync kernel (FF_FUSED_A_IMPL=1)
      python3 benchmarks/general_a.py --only 4 14 15 --out "$OUT" 2>&1 | tee "$OUT/general_a_s2.txt" | tail -30
      FF_FUSED_A_IMPL=1 python3 benchmarks/general_a.py --only 4 14 15 --tag mma_sync_only --out "$OUT" 2>&1 \
        | tee "$OUT/general_a_s2_mma_sync_only.txt" | tail -30 ;;
    general-a-s2-narrow)   # stride 2 with 64-pixel output rows: default kernel choice, wgmma only, mma.sync only
      python3 benchmarks/general_a.py --only 16 --out "$OUT" 2>&1 | tee "$OUT/general_a_s2_narrow.txt" | tail -6
      FF_FUSED_A_NARROW=0 python3 benchmarks/general_a.py --only 16 --tag wgmma_only --out "$OUT" 2>&1 | tee "$OUT/general_a_s2_narrow_wgmma.txt" | tail -6
      FF_FUSED_A_IMPL=1 python3 benchmarks/general_a.py --only 16 --tag mma_sync_only --out "$OUT" 2>&1 | tee "$OUT/general_a_s2_narrow_mma_sync.txt" | tail -6 ;;
    general-a-r2)   # rows of 30..64 output pixels: default (two rows per tile), one row per tile, mma.sync only; 30-pixel rows on R2
      python3 benchmarks/general_a.py --only 10 16 17 11 --out "$OUT" 2>&1 | tee "$OUT/general_a_r2.txt" | tail -10
      FF_FUSED_A_R2=0 python3 benchmarks/general_a.py --only 10 16 17 --tag one_row_per_tile --out "$OUT" 2>&1 | tee "$OUT/general_a_r2_off.txt" | tail -8
      FF_FUSED_A_IMPL=1 python3 benchmarks/general_a.py --only 10 16 17 --tag mma_sync_only --out "$OUT" 2>&1 | tee "$OUT/general_a_r2_mma_sync.txt" | tail -8
      FF_FUSED_A_NARROW=0 python3 benchmarks/general_a.py --only 11 --tag r2_at_30 --out "$OUT" 2>&1 | tee "$OUT/general_a_r2_at_30.txt" | tail -4 ;;
    general-a-pairs)   # 16-bit over > 8 input channels: two channel groups per k16 op (default) against one (FF_FUSED_A_PAIR16=0)
      python3 benchmarks/general_a.py --only 6 7 13 14 18 --modes bfloat16:auto --out "$OUT" 2>&1 | tee "$OUT/general_a_pairs.txt" | tail -8
      FF_FUSED_A_PAIR16=0 python3 benchmarks/general_a.py --only 6 7 13 14 18 --modes bfloat16:auto --tag one_group_per_op \
        --out "$OUT" 2>&1 | tee "$OUT/general_a_pairs_off.txt" | tail -8
      ff bench --family A --shape 4,4,64,128,128 --dtype bfloat16 --variants fallback fused --layout both --repeats 20 --out "$OUT" --tag conv3d 2>&1 | tail -3
      FF_FUSED_A_PAIR16=0 ff bench --family A --shape 4,4,64,128,128 --dtype bfloat16 --variants fused --layout both --repeats 20 --out "$OUT" --tag conv3d_one_group_per_op 2>&1 | tail -3 ;;
    general-a-line-c16)   # op lists as long as a 3x3 filter's over 9..16 channels straight-line (default) against the general
      # chain (FF_FUSED_A_LINE_C16=0); rows of <= 128 output pixels with ring slots for 128 + halo columns (default) against
      # 256 (FF_FUSED_A_HALFSPAN=0)
      python3 benchmarks/general_a.py --only 6 13 18 19 20 21 --out "$OUT" 2>&1 | tee "$OUT/general_a_line_c16.txt" | tail -14
      FF_FUSED_A_LINE_C16=0 python3 benchmarks/general_a.py --only 6 19 --tag general_chain \
        --out "$OUT" 2>&1 | tee "$OUT/general_a_line_c16_off.txt" | tail -6
      FF_FUSED_A_HALFSPAN=0 python3 benchmarks/general_a.py --only 13 18 19 20 21 --tag span256 --out "$OUT" 2>&1 \
        | tee "$OUT/general_a_halfspan_off.txt" | tail -12 ;;
    seed-a)   # family A at the seed, fused and fallback, every precision, both layouts (a quick check against the record)
      for spec in "float32 auto" "float32 ieee" "bfloat16 auto" "float16 auto"; do
        read -r d pr <<< "$spec"
        ff bench --family A --dtype $d --precision $pr --variants fallback fused --layout both --repeats 20 --out "$OUT" 2>&1 | tail -3
      done ;;
    general-a-rgb)   # the grid's RGB row (C 3: channels_last copied to NCHW first)
      python3 benchmarks/general_a.py --only 8 --out "$OUT" 2>&1 | tee "$OUT/general_a_rgb.txt" | tail -4 ;;
    bench-b) ff bench --family B --layout both --variants eager fallback fused --repeats 20 --out "$OUT" 2>&1 | tail -6 ;;
    bench-quick) ff bench --variants eager fallback fused --layout both --repeats 20 --out "$OUT" 2>&1 | tail -30 ;;
    bench-full) ff bench --layout both --out "$OUT" 2>&1 | tail -40 ;;
    final)   # the recorded comparison: one JSON + PNG per invocation, re-packed into one archive after each
      mkdir -p "$OUT/r"
      for fam in A B; do ff bench --family $fam --layout contiguous --repeats 20 --out "$OUT/r" --tag full 2>&1 | tail -9; pack; done
      for d in bfloat16 float16; do ff bench --dtype $d --variants eager fallback fused --layout channels_last --repeats 20 --out "$OUT/r" 2>&1 | tail -5; pack; done
      ff bench --precision ieee --variants eager fallback fused --layout channels_last --repeats 20 --out "$OUT/r" --tag ieee 2>&1 | tail -5; pack
      for fam in A B; do ff bench --family $fam --layout channels_last --repeats 20 --out "$OUT/r" --tag full 2>&1 | tail -9; pack; done
      rm -rf "$OUT/r" ;;
    final-a)   # family A only: the recorded comparison with the current fused kernel, plus the scaling table
      mkdir -p "$OUT/r"
      ff bench --family A --layout both --repeats 20 --out "$OUT/r" --tag full 2>&1 | tail -4; pack
      ff bench --family A --precision ieee --variants eager fallback fused --layout both --repeats 20 --out "$OUT/r" --tag ieee 2>&1 | tail -3; pack
      for d in bfloat16 float16; do ff bench --family A --dtype $d --variants eager fallback fused --layout both --repeats 20 --out "$OUT/r" 2>&1 | tail -3; pack; done
      python3 benchmarks/probe_scaling.py A 2>&1 | tee "$OUT/r/scaling_a.txt"; pack
      rm -rf "$OUT/r" ;;
    final-b)   # family B only: the recorded comparison, every precision and layout, scaling table, kernel-only probe
      mkdir -p "$OUT/r"
      ff bench --family B --layout both --repeats 20 --out "$OUT/r" --tag full 2>&1 | tail -4; pack
      ff bench --family B --precision ieee --variants eager fallback fused --layout both --repeats 20 --out "$OUT/r" --tag ieee 2>&1 | tail -3; pack
      for d in bfloat16 float16; do ff bench --family B --dtype $d --variants eager fallback fused --layout both --repeats 20 --out "$OUT/r" 2>&1 | tail -3; pack; done
      python3 benchmarks/probe_scaling.py B 2>&1 | tee "$OUT/r/scaling_b.txt"; pack
      python3 benchmarks/probe_fused_b.py 2>&1 | grep -v "^ptxas" | tee "$OUT/r/probe_fused_b.txt"; pack
      rm -rf "$OUT/r" ;;
    bench-dtypes)
      for p in tf32 ieee; do ff bench --precision $p --variants eager compile fallback fused --layout channels_last --out "$OUT" --tag $p 2>&1 | tail -8; done
      for d in bfloat16 float16; do ff bench --dtype $d --variants eager compile fallback fused --layout channels_last --out "$OUT" 2>&1 | tail -8; done ;;
  esac
done
# one archive of everything (the device tool returns a limited number of files)
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/all.tgz"
exit $rc
