// Per-node timing of a captured graph (gpu::Graph::time_nodes, gpu/memory.h)
// and the launch notes it uses (gpu/common.cuh).
//
// Why two figures per node. A decode step is one graph of small kernels
// chained by programmatic edges, so a kernel's cost in the step is not its
// duration alone: the next kernel's blocks start while it drains. "alone"
// rewires a clone of the graph into a plain chain with an event record node
// between every two nodes (each node starts after the one before has
// finished, as plain launches would): what the kernel costs by itself,
// launch gap included. "in graph" instantiates the graph cut after node i
// (every later node dropped, programmatic edges kept) for each i and takes
// the difference of consecutive cuts' times: what node i adds to the step
// as it really runs. The sum of "in graph" is the graph's time.
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <queue>
#include <string>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/memory.h"

namespace hmoe::gpu {

namespace {
thread_local std::vector<Graph::Note>* t_log = nullptr;
thread_local double t_bytes = -1;
thread_local std::string t_scope;
}  // namespace

namespace detail {
void set_launch_log(std::vector<Graph::Note>* log) { t_log = log; }
void note_launch(const void* func) {
  if (t_log) t_log->push_back({func, t_bytes, t_scope});
  t_bytes = -1;
}
void declare_launch_bytes(double bytes) { t_bytes = bytes; }
}  // namespace detail

LaunchScope::LaunchScope(std::string label) : saved_(std::exchange(t_scope, std::move(label))) {}
LaunchScope::~LaunchScope() { t_scope = std::move(saved_); }

namespace {

std::string demangled(const char* name) {
  int st = 0;
  char* dm = abi::__cxa_demangle(name, nullptr, nullptr, &st);
  std::string out = st == 0 && dm ? dm : name;
  std::free(dm);
  return out;
}

const char* node_kind(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    default: return "node";
  }
}

struct Edges {
  std::vector<cudaGraphNode_t> from, to;
  std::vector<cudaGraphEdgeData> data;
};
Edges edges_of(cudaGraph_t g) {
  Edges e;
  size_t n = 0;
  HMOE_CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  e.from.resize(n);
  e.to.resize(n);
  e.data.resize(n);
  if (n) HMOE_CUDA_CHECK(cudaGraphGetEdges(g, e.from.data(), e.to.data(), e.data.data(), &n));
  return e;
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t g) {
  size_t n = 0;
  HMOE_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> v(n);
  if (n) HMOE_CUDA_CHECK(cudaGraphGetNodes(g, v.data(), &n));
  return v;
}

// The nodes in dependency order (ties: the order cudaGraphGetNodes lists them, the capture order).
std::vector<cudaGraphNode_t> topo_order(cudaGraph_t g) {
  const std::vector<cudaGraphNode_t> nodes = nodes_of(g);
  std::map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  const Edges e = edges_of(g);
  std::vector<std::vector<size_t>> out(nodes.size());
  std::vector<int> indeg(nodes.size(), 0);
  for (size_t i = 0; i < e.from.size(); ++i) {
    const size_t a = index.at(e.from[i]), b = index.at(e.to[i]);
    out[a].push_back(b);
    ++indeg[b];
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (indeg[i] == 0) ready.push(i);
  std::vector<cudaGraphNode_t> order;
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(nodes[i]);
    for (size_t j : out[i])
      if (--indeg[j] == 0) ready.push(j);
  }
  if (order.size() != nodes.size()) fail(ErrorKind::internal, "gpu::Graph::time_nodes: the graph has a cycle");
  return order;
}

// RAII for the clones.
struct GraphHandle {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t x = nullptr;
  ~GraphHandle() {
    if (x) cudaGraphExecDestroy(x);
    if (g) cudaGraphDestroy(g);
  }
};

// Best of reps: one launch of x between two events.
double best_launch_us(cudaGraphExec_t x, Stream& s, int reps) {
  Event e0, e1;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    e0.record(s);
    HMOE_CUDA_CHECK(cudaGraphLaunch(x, detail::cs(s)));
    e1.record(s);
    e1.synchronize();
    best = std::min(best, 1e3 * static_cast<double>(e1.elapsed_ms(e0)));
  }
  return best;
}

}  // namespace

GraphTiming Graph::time_nodes(Stream& s, int reps) const {
  if (!graph_ || !exec_) fail(ErrorKind::internal, "gpu::Graph::time_nodes: nothing captured");
  reps = std::max(reps, 1);
  cudaGraph_t g = static_cast<cudaGraph_t>(graph_);
  const std::vector<cudaGraphNode_t> order = topo_order(g);
  const size_t n = order.size();
  GraphTiming out;
  out.nodes.resize(n);

  // What each node is; kernel nodes take the launch notes in order (matched by function).
  size_t note = 0;
  for (size_t i = 0; i < n; ++i) {
    NodeTime& t = out.nodes[i];
    cudaGraphNodeType type{};
    HMOE_CUDA_CHECK(cudaGraphNodeGetType(order[i], &type));
    t.name = node_kind(type);
    if (type != cudaGraphNodeTypeKernel) continue;
    t.kernel = true;
    cudaKernelNodeParams kp{};
    if (cudaGraphKernelNodeGetParams(order[i], &kp) != cudaSuccess) {
      (void)cudaGetLastError();
      t.name = "?";
      continue;
    }
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kp.func) == cudaSuccess && name) t.name = demangled(name);
    else {
      (void)cudaGetLastError();
      t.name = "?";
    }
    t.grid[0] = kp.gridDim.x;
    t.grid[1] = kp.gridDim.y;
    t.grid[2] = kp.gridDim.z;
    t.block[0] = kp.blockDim.x;
    t.block[1] = kp.blockDim.y;
    t.block[2] = kp.blockDim.z;
    t.smem = kp.sharedMemBytes;
    auto same = [&](const void* f) {
      if (f == kp.func) return true;
      const char* nn = nullptr;
      const bool ok = cudaFuncGetName(&nn, f) == cudaSuccess && nn && demangled(nn) == t.name;
      (void)cudaGetLastError();
      return ok;
    };
    if (note < notes_.size() && same(notes_[note].func)) {
      t.bytes = notes_[note].bytes;
      t.scope = notes_[note].scope;
      ++note;
    }
  }

  HMOE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), detail::cs(s)));  // warm-up
  s.synchronize();
  out.graph_us = best_launch_us(static_cast<cudaGraphExec_t>(exec_), s, reps);
  {
    GraphHandle e;
    HMOE_CUDA_CHECK(cudaGraphCreate(&e.g, 0));
    HMOE_CUDA_CHECK(cudaGraphInstantiate(&e.x, e.g, 0));
    out.empty_us = best_launch_us(e.x, s, reps);
  }

  // Alone: a clone rewired as node, event, node, event, ...
  {
    GraphHandle c;
    HMOE_CUDA_CHECK(cudaGraphClone(&c.g, g));
    std::vector<cudaGraphNode_t> cn(n);
    for (size_t i = 0; i < n; ++i) HMOE_CUDA_CHECK(cudaGraphNodeFindInClone(&cn[i], order[i], c.g));
    Edges e = edges_of(c.g);
    if (!e.from.empty())
      HMOE_CUDA_CHECK(cudaGraphRemoveDependencies(c.g, e.from.data(), e.to.data(), e.data.data(), e.from.size()));
    std::vector<Event> ev(n + 1);
    cudaGraphNode_t prev = nullptr;
    HMOE_CUDA_CHECK(cudaGraphAddEventRecordNode(&prev, c.g, nullptr, 0, static_cast<cudaEvent_t>(ev[0].handle())));
    for (size_t i = 0; i < n; ++i) {
      HMOE_CUDA_CHECK(cudaGraphAddDependencies(c.g, &prev, &cn[i], nullptr, 1));
      HMOE_CUDA_CHECK(cudaGraphAddEventRecordNode(&prev, c.g, &cn[i], 1, static_cast<cudaEvent_t>(ev[i + 1].handle())));
    }
    HMOE_CUDA_CHECK(cudaGraphInstantiate(&c.x, c.g, 0));
    for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up
      HMOE_CUDA_CHECK(cudaGraphLaunch(c.x, detail::cs(s)));
      s.synchronize();
      if (r == 0) continue;
      for (size_t i = 0; i < n; ++i) {
        const double us = 1e3 * static_cast<double>(ev[i + 1].elapsed_ms(ev[i]));
        out.nodes[i].alone_us = r == 1 ? us : std::min(out.nodes[i].alone_us, us);
      }
    }
  }

  // In graph: the graph cut after node i, for every i.
  double before = out.empty_us;
  for (size_t i = 0; i < n; ++i) {
    GraphHandle c;
    HMOE_CUDA_CHECK(cudaGraphClone(&c.g, g));
    for (size_t j = n; j-- > i + 1;) {
      cudaGraphNode_t x = nullptr;
      HMOE_CUDA_CHECK(cudaGraphNodeFindInClone(&x, order[j], c.g));
      HMOE_CUDA_CHECK(cudaGraphDestroyNode(x));
    }
    HMOE_CUDA_CHECK(cudaGraphInstantiate(&c.x, c.g, 0));
    HMOE_CUDA_CHECK(cudaGraphLaunch(c.x, detail::cs(s)));  // warm-up
    s.synchronize();
    const double t = best_launch_us(c.x, s, reps);
    out.nodes[i].in_graph_us = t - before;
    before = t;
  }
  return out;
}

}  // namespace hmoe::gpu
