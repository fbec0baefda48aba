// Machine topology as the expert engine sees it: NUMA nodes, the physical
// cores and PUs of each, the memory of each, and the node each GPU hangs off.
//
// Read through hwloc, from the machine or from HMOE_TOPOLOGY (an hwloc
// synthetic description such as "numa:2 core:2 pu:1", or the path of an
// XML file written by `lstopo foo.xml`), so that 2- and 4-node layouts can be
// tested on a 1-node machine. The result is plain data: no hwloc handle
// outlives load(). Immutable after load; safe to share between threads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hmoe::numa {

struct NodeInfo {
  int os_index = 0;            // the kernel's node number (libnuma's)
  std::vector<int> core_pus;   // first PU (OS index) of each physical core
  std::vector<int> pus;        // every PU (OS index) of the node
  uint64_t memory_bytes = 0;   // local memory hwloc reports (0 if unknown)
};

struct GpuInfo {
  std::string pci_bus_id;  // "0000:1b:00.0"
  int node = -1;           // index into Topology::nodes, -1 if unknown
};

struct Topology {
  std::string source;         // "machine", "synthetic:<desc>" or "xml:<path>"
  bool this_system = true;    // false for synthetic / XML: binding is best effort
  int packages = 1;
  std::vector<NodeInfo> nodes;  // never empty after load()
  std::vector<GpuInfo> gpus;

  // spec empty: this machine. Otherwise an existing file is read as XML and
  // anything else as a synthetic description. Throws Error(invalid_argument)
  // naming HMOE_TOPOLOGY when hwloc rejects it.
  static Topology load(const std::string& spec);

  int node_count() const { return static_cast<int>(nodes.size()); }
  int core_count() const;
  int pu_count() const;
  // One line per node, for logs and `hmoe bench`.
  std::string describe() const;
};

}  // namespace hmoe::numa
