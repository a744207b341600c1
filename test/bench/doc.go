// Package bench is sluice's performance suite against its peers: every
// figure is a ratio to a baseline measured in the same run, with the
// median and the 99th percentile.
//
// One command runs it (as root: it makes network namespaces and sandboxes)
// and writes test/report/bench.md and test/report/bench.png:
//
//	SLUICE_BENCH=full go test ./test/bench -run TestBench -timeout 60m -v
//
// With -short it is a smoke run (a few iterations per section) that writes
// the same report with a smoke banner into a temporary directory, or into
// BENCH_OUT if that is set. The peers are Debian packages (squid,
// tinyproxy, bubblewrap, crun, dnsperf, dnsmasq-base, nginx-light, wrk) and
// the OPA v1.22.3 binary, built once into $HOME/.cache/sluice/. A peer that
// cannot run gives a row "not measured: reason", never a number.
package bench
