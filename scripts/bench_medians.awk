# Medians of bench_cuda_engine rows (bench/bench_cuda_engine.cc prints them) per (context, policy,
# budget, decode kernel, graphs off/on), and the on/off ratio of the decode t/s medians: for the
# interleaved A/Bs of scripts/device_check.sh (--repeat N). Portable awk (mawk, gawk).
#   awk -f scripts/bench_medians.awk bench_engine_graphs.txt
function median(arr, k, cnt,   i, j, t, a) {
  for (i = 1; i <= cnt; ++i) a[i] = arr[k, i] + 0;
  for (i = 2; i <= cnt; ++i) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; --j) a[j + 1] = a[j]; a[j + 1] = t }
  return cnt % 2 ? a[(cnt + 1) / 2] : (a[cnt / 2] + a[cnt / 2 + 1]) / 2
}
$1 !~ /^#/ && $1 != "model" && NF >= 19 && $2 ~ /^[0-9]+$/ {
  mode = $18 == "off" ? "off" : "on"
  base = $2 " " $3 " " $4 " " $5
  key = base " " mode
  if (!(key in n)) { order[++keys] = key }
  c = ++n[key]
  tps[key, c] = $8; step[key, c] = $9; pol[key, c] = $10; wait[key, c] = $15
  sub(/%$/, "", pol[key, c])
}
END {
  printf "%-8s %-12s %6s %-8s %-5s %3s %11s %9s %8s %9s\n", "context", "policy", "budget", "kernel", "graph", "n", "decode t/s", "step ms", "policy%", "wait ms"
  for (i = 1; i <= keys; ++i) {
    k = order[i]; split(k, f, " ")
    med[k] = median(tps, k, n[k])
    printf "%-8s %-12s %6s %-8s %-5s %3d %11.1f %9.3f %8.1f %9.3f\n", f[1], f[2], f[3], f[4], f[5], n[k], med[k], median(step, k, n[k]), median(pol, k, n[k]), median(wait, k, n[k])
  }
  for (i = 1; i <= keys; ++i) {
    k = order[i]; split(k, f, " ")
    if (f[5] != "on") continue
    off = f[1] " " f[2] " " f[3] " " f[4] " off"
    if (off in med && med[off] > 0) printf "graphs on/off, %s %s@%s %s: decode t/s x%.3f (medians of %d and %d runs)\n", f[1], f[2], f[3], f[4], med[k] / med[off], n[k], n[off]
  }
}
