// hwloc -> plain data. Everything hwloc-specific stays in this file.
#include "numa/topology.h"

#include <hwloc.h>

#include <filesystem>
#include <memory>
#include <sstream>

#include "configs/error.h"

namespace hmoe::numa {

namespace {

struct TopologyHandle {
  hwloc_topology_t t = nullptr;
  ~TopologyHandle() {
    if (t) hwloc_topology_destroy(t);
  }
};

std::vector<int> pus_of(hwloc_topology_t t, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
  std::vector<int> out;
  const int n = hwloc_get_nbobjs_inside_cpuset_by_type(t, set, type);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_inside_cpuset_by_type(t, set, type, i);
    if (!o || !o->cpuset) continue;
    const int pu = hwloc_bitmap_first(o->cpuset);
    if (pu >= 0) out.push_back(pu);
  }
  return out;
}

}  // namespace

Topology Topology::load(const std::string& spec) {
  TopologyHandle h;
  if (hwloc_topology_init(&h.t) != 0) fail(ErrorKind::internal, "hwloc_topology_init failed");
  Topology topo;
  if (spec.empty()) {
    topo.source = "machine";
    hwloc_topology_set_io_types_filter(h.t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  } else {
    std::error_code ec;
    const bool is_file = std::filesystem::is_regular_file(spec, ec);
    const int rc = is_file ? hwloc_topology_set_xml(h.t, spec.c_str()) : hwloc_topology_set_synthetic(h.t, spec.c_str());
    if (rc != 0)
      fail(ErrorKind::invalid_argument, std::string("HMOE_TOPOLOGY / --topology: hwloc rejects ") + (is_file ? "the XML file '" : "the synthetic description '") +
                                            spec + "' (synthetic example: \"numa:2 core:4 pu:1\")");
    topo.source = (is_file ? "xml:" : "synthetic:") + spec;
  }
  if (hwloc_topology_load(h.t) != 0) fail(ErrorKind::invalid_argument, "hwloc could not load the topology '" + topo.source + "'");
  topo.this_system = hwloc_topology_is_thissystem(h.t) != 0;
  topo.packages = std::max(1, hwloc_get_nbobjs_by_type(h.t, HWLOC_OBJ_PACKAGE));

  const int nn = hwloc_get_nbobjs_by_type(h.t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nn; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(h.t, HWLOC_OBJ_NUMANODE, i);
    if (!node || !node->cpuset || hwloc_bitmap_iszero(node->cpuset)) continue;  // memory-only nodes (CXL, HBM) run no workers
    NodeInfo info;
    info.os_index = static_cast<int>(node->os_index);
    info.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    info.core_pus = pus_of(h.t, node->cpuset, HWLOC_OBJ_CORE);
    info.pus = pus_of(h.t, node->cpuset, HWLOC_OBJ_PU);
    if (info.core_pus.empty()) info.core_pus = info.pus;
    if (!info.pus.empty()) topo.nodes.push_back(std::move(info));
  }
  if (topo.nodes.empty()) {
    // No NUMA information (some VMs): one node holding every PU.
    NodeInfo info;
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(h.t);
    info.core_pus = pus_of(h.t, all, HWLOC_OBJ_CORE);
    info.pus = pus_of(h.t, all, HWLOC_OBJ_PU);
    if (info.pus.empty()) info.pus.push_back(0);
    if (info.core_pus.empty()) info.core_pus = info.pus;
    topo.nodes.push_back(std::move(info));
  }

  // GPUs: NVIDIA / AMD display or 3D controllers among the PCI devices.
  for (hwloc_obj_t o = hwloc_get_next_pcidev(h.t, nullptr); o; o = hwloc_get_next_pcidev(h.t, o)) {
    const unsigned cls = o->attr->pcidev.class_id >> 8, vendor = o->attr->pcidev.vendor_id;
    if (cls != 0x03 || (vendor != 0x10de && vendor != 0x1002)) continue;
    GpuInfo g;
    char bus[32];
    std::snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%01x", o->attr->pcidev.domain, o->attr->pcidev.bus, o->attr->pcidev.dev,
                  o->attr->pcidev.func);
    g.pci_bus_id = bus;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h.t, o);
    if (anc && anc->nodeset) {
      const int os = hwloc_bitmap_first(anc->nodeset);
      for (size_t n = 0; n < topo.nodes.size(); ++n)
        if (topo.nodes[n].os_index == os) g.node = static_cast<int>(n);
    }
    topo.gpus.push_back(g);
  }
  return topo;
}

int Topology::core_count() const {
  int c = 0;
  for (const auto& n : nodes) c += static_cast<int>(n.core_pus.size());
  return c;
}

int Topology::pu_count() const {
  int c = 0;
  for (const auto& n : nodes) c += static_cast<int>(n.pus.size());
  return c;
}

std::string Topology::describe() const {
  std::ostringstream s;
  s << "topology " << source << (this_system ? "" : " (not this machine: binding is best effort)") << ": " << packages
    << " package(s), " << nodes.size() << " NUMA node(s), " << core_count() << " cores, " << pu_count() << " PUs";
  for (size_t i = 0; i < nodes.size(); ++i)
    s << "\n  node " << i << " (os " << nodes[i].os_index << "): " << nodes[i].core_pus.size() << " cores, " << nodes[i].pus.size()
      << " PUs, " << (nodes[i].memory_bytes >> 20) << " MiB";
  for (const auto& g : gpus) s << "\n  gpu " << g.pci_bus_id << " on node " << g.node;
  return s.str();
}

}  // namespace hmoe::numa
