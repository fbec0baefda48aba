// ThreadPool and NodePools: every item runs exactly once, exceptions come
// back, and start-up / shutdown never deadlock in spin or sleep mode.
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>

#include "numa/node_pools.h"
#include "numa/thread_pool.h"

using namespace hmoe;

TEST_CASE("parallel_for covers every item once, in both wait modes") {
  for (bool spin : {true, false})
    for (int threads : {1, 2, 3, 5}) {
      numa::ThreadPool pool(threads, spin);
      CHECK(pool.size() == threads);
      for (int64_t n : {0, 1, 7, 1000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e, int w) {
          REQUIRE(w >= 0);
          REQUIRE(w < threads);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits) REQUIRE(h.load() == 1);
      }
    }
}

TEST_CASE("an exception in a chunk reaches the caller and the pool stays usable") {
  numa::ThreadPool pool(3, true);
  CHECK_THROWS_WITH(pool.parallel_for(100, [](int64_t b, int64_t, int) {
    if (b >= 50) throw std::runtime_error("chunk failed");
  }), "chunk failed");
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  CHECK(sum.load() == 4950);
}

TEST_CASE("start-up and shutdown stress: many pools, jobs or none, spin and sleep") {
  for (bool spin : {true, false})
    for (int round = 0; round < 200; ++round) {
      numa::ThreadPool pool(1 + round % 4, spin, std::vector<std::vector<int>>{}, round % 2 == 0);
      std::atomic<int> count{0};
      for (int j = 0; j < round % 3; ++j) pool.parallel_for(17, [&](int64_t b, int64_t e, int) { count += static_cast<int>(e - b); });
      CHECK(count.load() == 17 * (round % 3));
    }
}

TEST_CASE("a pool the caller does not join still runs everything") {
  for (bool spin : {true, false}) {
    numa::ThreadPool pool(2, spin, std::vector<std::vector<int>>{}, false);
    CHECK(pool.size() == 2);
    for (int rep = 0; rep < 100; ++rep) {
      std::atomic<int> count{0};
      pool.start(50, [&](int64_t b, int64_t e, int w) {
        REQUIRE(w >= 0);
        count += static_cast<int>(e - b);
      });
      pool.finish();
      REQUIRE(count.load() == 50);
    }
  }
}

TEST_CASE("NodePools on synthetic 1-, 2- and 4-node topologies, both wait modes") {
  for (const char* topo : {"", "numa:2 core:1 pu:1", "numa:4 core:1 pu:1", "pack:2 numa:2 core:2 pu:2"})
    for (bool power_saving : {false, true})
      for (int rep = 0; rep < 20; ++rep) {
        numa::PoolOptions o;
        o.topology = topo;
        o.power_saving = power_saving;
        o.threads = 1 + rep % 5;
        o.quiet = true;
        numa::NodePools pools(o);
        const int nn = pools.nodes();
        REQUIRE(nn >= 1);
        CHECK(pools.threads() >= std::max(nn, o.threads));
        std::vector<int64_t> items;
        for (int j = 0; j < nn; ++j) items.push_back(10 + j);
        std::vector<std::atomic<int>> per(static_cast<size_t>(nn));
        pools.run(items, [&](int node, int64_t b, int64_t e, int) { per[static_cast<size_t>(node)] += static_cast<int>(e - b); });
        for (int j = 0; j < nn; ++j) REQUIRE(per[static_cast<size_t>(j)].load() == 10 + j);
      }
}

TEST_CASE("NodePools reports a failing node's exception after all nodes finish") {
  numa::PoolOptions o;
  o.topology = "numa:2 core:1 pu:1";
  o.threads = 2;
  o.quiet = true;
  numa::NodePools pools(o);
  REQUIRE(pools.nodes() == 2);
  std::atomic<int> done{0};
  CHECK_THROWS_WITH(pools.run({5, 5}, [&](int node, int64_t b, int64_t e, int) {
    done += static_cast<int>(e - b);
    if (node == 1) throw std::runtime_error("node 1 failed");
  }), "node 1 failed");
  std::atomic<int> again{0};
  pools.run({3, 4}, [&](int, int64_t b, int64_t e, int) { again += static_cast<int>(e - b); });
  CHECK(again.load() == 7);
}

TEST_CASE("threads = 0 means the topology's cores, less the reserved ones") {
  numa::PoolOptions o;
  o.topology = "numa:2 core:3 pu:2";
  o.quiet = true;
  numa::NodePools all(o);
  CHECK(all.threads() == 6);
  o.reserve_cores = 1;
  numa::NodePools fewer(o);
  CHECK(fewer.threads() == 5);
  o.reserve_cores = -1;  // one only when the topology lists a GPU; synthetic ones list none
  numa::NodePools auto_reserve(o);
  CHECK(auto_reserve.threads() == 6);
}
