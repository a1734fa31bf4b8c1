# Shared by bench/sm-vs-ompi.sh and bench/tcp-vs-ompi.sh: one Markdown
# table row per message size, gompi against Open MPI, from "mode size value
# round" lines in gompi.all and ompi.all (files named so). Variables: m (the
# mode to print), better ("lower" or "higher": which end is the best round).
FILENAME ~ /gompi/ && $1 == m { g[$2] = g[$2] " " $3; sz[$2] = 1 }
FILENAME ~ /ompi.all/ && FILENAME !~ /gompi/ && $1 == m { o[$2] = o[$2] " " $3; sz[$2] = 1 }
function stats(s, out,   a, n, i, j, t) {
  n = split(s, a, " ")
  for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j+1] = a[j]; a[j+1] = t }
  out["n"] = n; if (n == 0) return
  out["med"] = (n % 2) ? a[(n + 1) / 2] : (a[n/2] + a[n/2 + 1]) / 2
  out["best"] = (better == "lower") ? a[1] : a[n]
  out["spread"] = out["med"] > 0 ? 100 * (a[n] - a[1]) / out["med"] : 0
}
END {
  ns = 0; for (s in sz) list[++ns] = s + 0
  for (i = 2; i <= ns; i++) { t = list[i]; for (j = i - 1; j >= 1 && list[j] > t; j--) list[j+1] = list[j]; list[j+1] = t }
  for (i = 1; i <= ns; i++) {
    s = list[i]; delete G; delete O
    stats(g[s], G); stats(o[s], O)
    gm = G["n"] ? sprintf("%.2f | %.2f | %.0f%%", G["med"], G["best"], G["spread"]) : "- | - | -"
    om = O["n"] ? sprintf("%.2f | %.2f | %.0f%%", O["med"], O["best"], O["spread"]) : "- | - | -"
    ratio = (G["n"] && O["n"] && O["med"] > 0) ? sprintf("%.2f", G["med"] / O["med"]) : "-"
    printf "| %d | %s | %s | %s |\n", s, gm, om, ratio
  }
}
