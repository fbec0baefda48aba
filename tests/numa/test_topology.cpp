// Topology from the machine, synthetic descriptions and XML; binding modes
// and their fallback; bad inputs.
#include <doctest/doctest.h>

#include <sched.h>

#include <cstdlib>

#include "configs/error.h"
#include "configs/settings.h"
#include "numa/node_pools.h"
#include "numa/topology.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("the machine's topology has at least one node with cores") {
  auto t = numa::Topology::load("");
  CHECK(t.this_system);
  REQUIRE(t.node_count() >= 1);
  CHECK(t.core_count() >= 1);
  CHECK(t.pu_count() >= t.core_count());
  CHECK(t.describe().find("node 0") != std::string::npos);
}

TEST_CASE("synthetic 2- and 4-node topologies") {
  auto t2 = numa::Topology::load("numa:2 core:3 pu:2");
  CHECK_FALSE(t2.this_system);
  REQUIRE(t2.node_count() == 2);
  CHECK(t2.core_count() == 6);
  CHECK(t2.pu_count() == 12);
  CHECK(t2.nodes[1].core_pus.size() == 3);
  auto t4 = numa::Topology::load("pack:2 numa:2 core:2 pu:1");
  REQUIRE(t4.node_count() == 4);
  CHECK(t4.packages == 2);
  for (const auto& n : t4.nodes) CHECK(n.core_pus.size() == 2);
}

TEST_CASE("XML topology files round-trip through hwloc") {
  test::TempDir dir("numa-topo");
  // A synthetic topology exported by hwloc itself would need lstopo; write the
  // minimal v2 XML that hwloc accepts: one machine, two nodes, two cores each.
  const std::string xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9" local_memory="1073741824"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="12">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13"/>
      </object>
    </object>
  </object>
</topology>
)";
  const std::string path = dir.str() + "/two-node.xml";
  test::write_file(path, xml);
  auto t = numa::Topology::load(path);
  REQUIRE(t.node_count() == 2);
  CHECK(t.nodes[1].os_index == 1);
  CHECK(t.nodes[1].core_pus == std::vector<int>{2, 3});
  CHECK(t.nodes[0].memory_bytes == (1ull << 30));
  CHECK(t.source.rfind("xml:", 0) == 0);
}

TEST_CASE("bad topology descriptions and binding names are errors, not aborts") {
  CHECK_THROWS_WITH_AS(numa::Topology::load("numa:two core:1"), doctest::Contains("HMOE_TOPOLOGY"), Error);
  CHECK_THROWS_AS(numa::Topology::load("this is not hwloc"), Error);
  CHECK_THROWS_WITH_AS(numa::parse_binding("socket"), doctest::Contains("core, numa_node, none"), Error);
  CHECK(numa::parse_binding("core") == numa::Binding::core);
  CHECK(numa::parse_binding("none") == numa::Binding::none);
  Settings s = Settings::defaults();
  s.threads = -3;  // out of range: the settings check (configs/settings.inc)
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("HMOE_THREADS=-3"), Error);
  s.threads = 2;
  s.thread_binding = "sockets";
  CHECK_THROWS_AS(numa::PoolOptions::from_settings(s), Error);
}

TEST_CASE("core binding falls back when the topology's CPUs are not ours") {
  numa::PoolOptions o;
  o.topology = "numa:2 core:8 pu:1";  // CPUs 0..15: more than this process may use (unless it has 16)
  o.binding = numa::Binding::core;
  o.threads = 4;
  o.quiet = true;
  numa::NodePools pools(o);
  CHECK(pools.nodes() == 2);
  CHECK(pools.threads() == 4);
  CHECK_FALSE(pools.membind());  // synthetic: never binds memory
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  if (CPU_COUNT(&set) < 16) CHECK(pools.binding() != numa::Binding::core);
  // On the machine: core binding holds exactly when every core's PU is ours.
  numa::PoolOptions n1;
  n1.binding = numa::Binding::core;
  n1.threads = 1;
  n1.quiet = true;
  numa::NodePools one(n1);
  bool all_ours = true;
  for (const auto& node : one.topology().nodes)
    for (int pu : node.core_pus) all_ours = all_ours && CPU_ISSET(pu, &set);
  CHECK((one.binding() == numa::Binding::core) == all_ours);
}
