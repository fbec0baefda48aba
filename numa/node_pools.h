// NodePools: one ThreadPool per NUMA node, workers bound to their node, and
// NodeBuffer: memory placed on one node.
//
// Binding (HMOE_THREAD_BINDING): core pins each worker to one physical core
// of its node, numa_node lets it float over its node's PUs, none leaves it
// to the OS. When the wanted CPUs are not all in this process's allowed set
// (containers with holey cpusets, synthetic topologies) core falls back to
// numa_node on the allowed PUs, and that to none; a single warning on stderr
// says so. Single-node machines, VMs and machines where numa_available()
// fails run one pool with a notice, never an abort.
//
// Thread counts: HMOE_THREADS is the total (0 = physical cores of the
// topology minus reserve_cores). Each node gets a share proportional to its
// cores, at least one; node 0's pool includes the calling thread.
//
// Thread safety: run() and pool() are for one caller at a time (the step
// thread), like ThreadPool itself.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "numa/thread_pool.h"
#include "numa/topology.h"

namespace hmoe {
struct Settings;
}

namespace hmoe::numa {

enum class Binding { core, numa_node, none };
Binding parse_binding(const std::string& s);  // throws Error(invalid_argument)
const char* binding_name(Binding b);

struct PoolOptions {
  int threads = 0;                 // total; 0 = physical cores - reserve_cores
  int reserve_cores = 0;           // kept free when threads = 0; -1: one if the topology has a GPU (this process drives it)
  Binding binding = Binding::numa_node;
  bool power_saving = false;       // true: sleep between jobs; false: spin first
  std::string topology;            // "" = this machine (see Topology::load)
  bool quiet = false;              // no notices on stderr (tests)

  static PoolOptions from_settings(const Settings& s);
};

class NodePools {
 public:
  explicit NodePools(const PoolOptions& opt);
  ~NodePools();

  const Topology& topology() const { return topo_; }
  int nodes() const { return static_cast<int>(pools_.size()); }
  ThreadPool& pool(int node) { return *pools_[static_cast<size_t>(node)]; }
  int threads() const;
  Binding binding() const { return binding_; }  // after any fallback
  // Whether NodeBuffer can place memory on real nodes (multi-node machine, libnuma works).
  bool membind() const { return membind_; }
  std::string describe() const;

  // Runs fn(node, begin, end, worker) over [0, items[node]) on every node's
  // pool at once; returns when all are done. First exception rethrown.
  using NodeFn = std::function<void(int node, int64_t begin, int64_t end, int worker)>;
  void run(const std::vector<int64_t>& items, const NodeFn& fn, int64_t grain = 1, int64_t max_chunk = 0);

 private:
  Topology topo_;
  Binding binding_ = Binding::none;
  bool membind_ = false;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
};

// Anonymous memory on one node: bound with mbind where the machine really
// has that node (membind), else plain pages. Pages are committed on first
// touch, so the owning node's workers should be the ones to write them.
class NodeBuffer {
 public:
  NodeBuffer() = default;
  NodeBuffer(size_t bytes, int os_node, bool membind);
  ~NodeBuffer();
  NodeBuffer(NodeBuffer&& o) noexcept { *this = std::move(o); }
  NodeBuffer& operator=(NodeBuffer&& o) noexcept;
  NodeBuffer(const NodeBuffer&) = delete;
  NodeBuffer& operator=(const NodeBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0, mapped_ = 0;
};

}  // namespace hmoe::numa
