#include "numa/node_pools.h"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "configs/error.h"
#include "configs/settings.h"

namespace hmoe::numa {

namespace {

std::once_flag g_binding_warning, g_single_node_notice;

std::vector<int> allowed_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

bool contains(const std::vector<int>& sorted, int c) { return std::binary_search(sorted.begin(), sorted.end(), c); }

}  // namespace

Binding parse_binding(const std::string& s) {
  if (s == "core") return Binding::core;
  if (s == "numa_node" || s == "node") return Binding::numa_node;
  if (s == "none") return Binding::none;
  fail(ErrorKind::invalid_argument, "HMOE_THREAD_BINDING / --thread-binding: '" + s + "' is not one of core, numa_node, none");
}

const char* binding_name(Binding b) { return b == Binding::core ? "core" : b == Binding::numa_node ? "numa_node" : "none"; }

PoolOptions PoolOptions::from_settings(const Settings& s) {
  PoolOptions o;
  o.threads = static_cast<int>(s.threads);
  o.binding = parse_binding(s.thread_binding);
  o.power_saving = s.power_saving;
  o.topology = s.topology;
  if (s.device != "cpu") o.reserve_cores = -1;
  return o;
}

NodePools::NodePools(const PoolOptions& opt) : topo_(Topology::load(opt.topology)) {
  const int nn = topo_.node_count();
  const int reserve = opt.reserve_cores >= 0 ? opt.reserve_cores : (topo_.gpus.empty() ? 0 : 1);
  int total = opt.threads > 0 ? opt.threads : std::max(1, topo_.core_count() - reserve);
  if (total < nn) {
    if (!opt.quiet)
      std::fprintf(stderr, "hmoe: %d thread(s) for %d NUMA nodes; using one per node so that every node streams its own slices\n", total, nn);
    total = nn;
  }
  // Threads per node, proportional to cores, at least one each.
  std::vector<int> per(static_cast<size_t>(nn), 1);
  const int cores = std::max(1, topo_.core_count());
  int given = nn;
  for (int i = 0; i < nn && given < total; ++i) {
    const int want = std::max(1, static_cast<int>(static_cast<int64_t>(total) * static_cast<int64_t>(topo_.nodes[static_cast<size_t>(i)].core_pus.size()) / cores));
    const int add = std::min(want - 1, total - given);
    per[static_cast<size_t>(i)] += std::max(0, add);
    given += std::max(0, add);
  }
  for (int i = 0; given < total; i = (i + 1) % nn, ++given) ++per[static_cast<size_t>(i)];

  // Binding plan, with fallback when the OS will not let us have the CPUs.
  const std::vector<int> allowed = allowed_cpus();
  binding_ = opt.binding;
  std::string why;
  if (binding_ == Binding::core) {
    for (int i = 0; i < nn && why.empty(); ++i) {
      const auto& cp = topo_.nodes[static_cast<size_t>(i)].core_pus;
      if (static_cast<int>(cp.size()) < per[static_cast<size_t>(i)]) why = "more threads than cores on node " + std::to_string(i);
      for (int c : cp)
        if (!contains(allowed, c)) why = "CPU " + std::to_string(c) + " is not in this process's allowed set (container cpuset?)";
    }
    if (!why.empty()) binding_ = Binding::numa_node;
  }
  std::vector<std::vector<int>> node_allowed(static_cast<size_t>(nn));
  for (int i = 0; i < nn; ++i)
    for (int c : topo_.nodes[static_cast<size_t>(i)].pus)
      if (contains(allowed, c)) node_allowed[static_cast<size_t>(i)].push_back(c);
  if (binding_ == Binding::numa_node) {
    for (int i = 0; i < nn; ++i)
      if (node_allowed[static_cast<size_t>(i)].empty() && why.empty())
        why = "node " + std::to_string(i) + " has no CPU in this process's allowed set";
    for (int i = 0; i < nn; ++i)
      if (node_allowed[static_cast<size_t>(i)].empty()) binding_ = Binding::none;
  }
  if (!why.empty() && !opt.quiet)
    std::call_once(g_binding_warning, [&] {
      std::fprintf(stderr, "hmoe: warning: thread binding '%s' is not possible (%s); using '%s'\n", binding_name(opt.binding), why.c_str(),
                   binding_name(binding_));
    });

  membind_ = topo_.this_system && nn > 1 && numa_available() >= 0;
  if (nn == 1 && !opt.quiet && topo_.source == "machine")
    std::call_once(g_single_node_notice, [] { std::fprintf(stderr, "hmoe: one NUMA node: one worker pool, no memory placement\n"); });

  int bind_failures = 0;
  for (int i = 0; i < nn; ++i) {
    const auto& node = topo_.nodes[static_cast<size_t>(i)];
    std::vector<std::vector<int>> aff(static_cast<size_t>(per[static_cast<size_t>(i)]));
    for (size_t t = 0; t < aff.size(); ++t) {
      if (binding_ == Binding::core) aff[t] = {node.core_pus[t]};
      else if (binding_ == Binding::numa_node) aff[t] = node_allowed[static_cast<size_t>(i)];
    }
    // Node 0's thread 0 is the caller: its affinity is left to the application.
    if (i == 0 && !aff.empty()) aff[0].clear();
    pools_.push_back(std::make_unique<ThreadPool>(per[static_cast<size_t>(i)], !opt.power_saving, aff, i == 0));
    bind_failures += pools_.back()->binding_failures();
  }
  if (bind_failures > 0 && !opt.quiet && why.empty())
    std::call_once(g_binding_warning, [&] {
      std::fprintf(stderr, "hmoe: warning: the OS refused to bind %d worker(s); they run unbound\n", bind_failures);
    });
}

NodePools::~NodePools() = default;

int NodePools::threads() const {
  int t = 0;
  for (const auto& p : pools_) t += p->size();
  return t;
}

std::string NodePools::describe() const {
  std::ostringstream s;
  s << nodes() << " pool(s), " << threads() << " thread(s) [";
  for (int i = 0; i < nodes(); ++i) s << (i ? " " : "") << pools_[static_cast<size_t>(i)]->size();
  s << "], binding " << binding_name(binding_) << (membind_ ? ", memory bound per node" : ", no memory binding");
  return s.str();
}

void NodePools::run(const std::vector<int64_t>& items, const NodeFn& fn, int64_t grain, int64_t max_chunk) {
  const int nn = nodes();
  std::vector<ThreadPool::Fn> fns(static_cast<size_t>(nn));
  for (int i = 0; i < nn; ++i) fns[static_cast<size_t>(i)] = [&fn, i](int64_t b, int64_t e, int w) { fn(i, b, e, w); };
  for (int i = nn - 1; i >= 0; --i) {
    const int64_t n = static_cast<size_t>(i) < items.size() ? items[static_cast<size_t>(i)] : 0;
    pools_[static_cast<size_t>(i)]->start(n, fns[static_cast<size_t>(i)], grain, max_chunk);
  }
  std::exception_ptr first;
  for (int i = 0; i < nn; ++i) {
    try {
      pools_[static_cast<size_t>(i)]->finish();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---- NodeBuffer -------------------------------------------------------------
NodeBuffer::NodeBuffer(size_t bytes, int os_node, bool membind) : size_(bytes) {
  if (bytes == 0) return;
  mapped_ = (bytes + 4095) & ~size_t{4095};
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail(ErrorKind::out_of_memory, "cannot map " + std::to_string(bytes) + " bytes for node " + std::to_string(os_node));
  madvise(p, mapped_, MADV_HUGEPAGE);
  if (membind) numa_tonode_memory(p, mapped_, os_node);
  data_ = static_cast<uint8_t*>(p);
}

NodeBuffer::~NodeBuffer() {
  if (data_) munmap(data_, mapped_);
}

NodeBuffer& NodeBuffer::operator=(NodeBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, mapped_);
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    o.data_ = nullptr;
    o.size_ = o.mapped_ = 0;
  }
  return *this;
}

}  // namespace hmoe::numa
