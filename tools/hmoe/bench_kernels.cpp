// hmoe bench MODEL --decode-kernels: the per-node table of one decode step
// (tools/hmoe/bench_kernels.h).
#include "tools/hmoe/bench_kernels.h"

#include <cstdio>
#include <map>
#include <string>

#include "engine/runtime/segment_graphs.h"

namespace hmoe::cli {

namespace {

std::string dims(const unsigned (&d)[3]) {
  char b[48];
  if (d[2] > 1) std::snprintf(b, sizeof(b), "%ux%ux%u", d[0], d[1], d[2]);
  else if (d[1] > 1) std::snprintf(b, sizeof(b), "%ux%u", d[0], d[1]);
  else std::snprintf(b, sizeof(b), "%u", d[0]);
  return b;
}

// GB/s and its share of the read probe, or "-" when the launch declared no bytes.
void rate(double bytes, double us, double read_bw, char* gbs, char* pct, size_t n) {
  if (bytes < 0 || us <= 0) {
    std::snprintf(gbs, n, "-");
    std::snprintf(pct, n, "-");
    return;
  }
  const double r = bytes / (us * 1e-6);
  std::snprintf(gbs, n, "%.0f", r / 1e9);
  if (read_bw > 0) std::snprintf(pct, n, "%.0f%%", 100.0 * r / read_bw);
  else std::snprintf(pct, n, "-");
}

}  // namespace

void print_decode_kernels(int64_t batch, const gpu::GraphTiming& t, double step_ms, double read_bw) {
  if (t.nodes.empty()) {
    std::printf("\nDecode step kernels, batch %lld: the last step ran no CUDA graph (--cuda-graphs 0, or a step the graphs do not take)\n",
                static_cast<long long>(batch));
    return;
  }
  std::printf("\nDecode step kernels, batch %lld (the last step's graph, node by node; alone: the node after every earlier one finished, "
              "an event either side; in graph: the graph cut after the node minus the graph cut before it, programmatic edges kept; "
              "best of the repetitions each; MB: what the launch declared it reads and writes (weights, activations, KV), - for a "
              "library's kernel; GB/s and %% of the %.0f GB/s read probe from the alone time):\n\n",
              static_cast<long long>(batch), read_bw / 1e9);
  std::printf("| # | part | kernel | grid | block | smem KB | MB | alone us | in graph us | GB/s | of read probe |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  double alone = 0, in_graph = 0, bytes = 0;
  struct Sum {
    int count = 0;
    double alone = 0, in_graph = 0, bytes = 0;
  };
  std::map<std::string, Sum> by_kernel, by_part;
  std::vector<std::string> kernel_order, part_order;
  for (size_t i = 0; i < t.nodes.size(); ++i) {
    const gpu::NodeTime& n = t.nodes[i];
    const std::string name = n.kernel ? kernel_short_name(n.name) : n.name;
    char gbs[32], pct[32], mb[32];
    rate(n.bytes, n.alone_us, read_bw, gbs, pct, sizeof(gbs));
    if (n.bytes >= 0) std::snprintf(mb, sizeof(mb), "%.2f", n.bytes / 1e6);
    else std::snprintf(mb, sizeof(mb), "-");
    std::printf("| %zu | %s | %s | %s | %s | %.1f | %s | %.1f | %.1f | %s | %s |\n", i, n.scope.empty() ? "-" : n.scope.c_str(), name.c_str(),
                n.kernel ? dims(n.grid).c_str() : "-", n.kernel ? dims(n.block).c_str() : "-", static_cast<double>(n.smem) / 1024.0, mb, n.alone_us,
                n.in_graph_us, gbs, pct);
    alone += n.alone_us;
    in_graph += n.in_graph_us;
    if (n.bytes > 0) bytes += n.bytes;
    // Parts: "layer 3 attention" -> "attention" (summed over layers).
    std::string part = n.scope.empty() ? "-" : n.scope;
    if (part.rfind("layer ", 0) == 0) part = part.substr(part.find(' ', 6) + 1);
    for (auto* m : {&by_kernel, &by_part}) {
      const std::string& key = m == &by_kernel ? name : part;
      Sum& s = (*m)[key];
      if (s.count == 0) (m == &by_kernel ? kernel_order : part_order).push_back(key);
      s.count += 1;
      s.alone += n.alone_us;
      s.in_graph += n.in_graph_us;
      if (n.bytes > 0) s.bytes += n.bytes;
    }
  }
  auto table = [&](const char* what, const std::map<std::string, Sum>& m, const std::vector<std::string>& order) {
    std::printf("\n| %s | nodes | alone us | in graph us | share of the graph | MB | GB/s in graph |\n|---|---|---|---|---|---|---|\n", what);
    for (const auto& k : order) {
      const Sum& s = m.at(k);
      char gbs[32], pct[32];
      rate(s.bytes > 0 ? s.bytes : -1, s.in_graph, read_bw, gbs, pct, sizeof(gbs));
      std::printf("| %s | %d | %.1f | %.1f | %.0f%% | %.2f | %s |\n", k.c_str(), s.count, s.alone, s.in_graph,
                  in_graph > 0 ? 100.0 * s.in_graph / in_graph : 0.0, s.bytes / 1e6, gbs);
    }
  };
  table("kernel", by_kernel, kernel_order);
  table("part (all layers)", by_part, part_order);
  std::printf("\nbatch %lld: %zu nodes; alone %.1f us summed; in graph %.1f us summed (of which %.1f us the graph launch itself); the whole graph "
              "%.1f us; %.1f MB declared (%.0f GB/s over the whole graph); the benchmark's step %.1f us (host work and the logits copy "
              "included)\n",
              static_cast<long long>(batch), t.nodes.size(), alone, in_graph + t.empty_us, t.empty_us, t.graph_us, bytes / 1e6,
              t.graph_us > 0 ? bytes / (t.graph_us * 1e-6) / 1e9 : 0.0, step_ms * 1e3);
}

}  // namespace hmoe::cli
