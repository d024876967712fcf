set terminal pngcairo size 1500,1100 font "Sans,11" noenhanced
set output 'bench/results/speedup_chart.png'
set multiplot layout 2,2 title "qwen3-0.6b, bf16, batch 1, 1 thread per rank: tp vs PyTorch 1.13.0a0 doing the same work; 3 rounds at 512, 1 round at 2048; medians of per-round ratios\nload average after the runs 2.0 (0.9-3.4) on 2 cores (the runs' own ranks included)\n(*) tp=4: oversubscribed, more ranks than the machine's 2 cores" font "Sans,12"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key top left horizontal
set ylabel "speedup against tp's tp = 1 (1 core)"
set xtics nomirror
set bmargin 3.5
set yrange [0:*]
set offsets 0, 0, graph 0.22, 0
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#666666'
set title "prefill 512 tokens (bars: speedup; labels: time)"
set xtics ("tp=1" 0, "tp=2" 1, "tp=4 (*)" 2, "PyTorch 1 process\nx 2 threads" 3)
plot 'bench/results/speedup_chart.dat' index 0 using 2 title 'tp' lc rgb '#1f5fa8', '' index 0 using 3 title 'PyTorch 1.13 (Transformers TP layout, gloo)' lc rgb '#e07b1a', '' index 0 using ($0-0.17):($2):(sprintf("%.2fx\n%s", $2, strcol(4))) with labels offset 0,1.2 font 'Sans,9' notitle, '' index 0 using ($0+0.17):($3):(sprintf("%.2fx\n%s", $3, strcol(5))) with labels offset 0,1.2 font 'Sans,9' notitle
set title "decode 16 tokens at 512 context (bars: speedup; labels: time per token)"
set xtics ("tp=1" 0, "tp=2" 1, "tp=4 (*)" 2, "PyTorch 1 process\nx 2 threads" 3)
plot 'bench/results/speedup_chart.dat' index 1 using 2 title 'tp' lc rgb '#1f5fa8', '' index 1 using 3 title 'PyTorch 1.13 (Transformers TP layout, gloo)' lc rgb '#e07b1a', '' index 1 using ($0-0.17):($2):(sprintf("%.2fx\n%s", $2, strcol(4))) with labels offset 0,1.2 font 'Sans,9' notitle, '' index 1 using ($0+0.17):($3):(sprintf("%.2fx\n%s", $3, strcol(5))) with labels offset 0,1.2 font 'Sans,9' notitle
set title "prefill 2048 tokens (bars: speedup; labels: time)"
set xtics ("tp=1" 0, "tp=2" 1, "tp=4 (*)" 2, "PyTorch 1 process\nx 2 threads" 3)
plot 'bench/results/speedup_chart.dat' index 2 using 2 title 'tp' lc rgb '#1f5fa8', '' index 2 using 3 title 'PyTorch 1.13 (Transformers TP layout, gloo)' lc rgb '#e07b1a', '' index 2 using ($0-0.17):($2):(sprintf("%.2fx\n%s", $2, strcol(4))) with labels offset 0,1.2 font 'Sans,9' notitle, '' index 2 using ($0+0.17):($3):(sprintf("%.2fx\n%s", $3, strcol(5))) with labels offset 0,1.2 font 'Sans,9' notitle
set title "decode 16 tokens at 2048 context (bars: speedup; labels: time per token)"
set xtics ("tp=1" 0, "tp=2" 1, "tp=4 (*)" 2, "PyTorch 1 process\nx 2 threads" 3)
plot 'bench/results/speedup_chart.dat' index 3 using 2 title 'tp' lc rgb '#1f5fa8', '' index 3 using 3 title 'PyTorch 1.13 (Transformers TP layout, gloo)' lc rgb '#e07b1a', '' index 3 using ($0-0.17):($2):(sprintf("%.2fx\n%s", $2, strcol(4))) with labels offset 0,1.2 font 'Sans,9' notitle, '' index 3 using ($0+0.17):($3):(sprintf("%.2fx\n%s", $3, strcol(5))) with labels offset 0,1.2 font 'Sans,9' notitle
unset multiplot
