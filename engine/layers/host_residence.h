// Where the routed experts of host MoE layers live when the GPU reads them
// by DMA (streamed prefill, engine/layers/expert_stream.h; split decode and
// the expert cache, engine/layers/gpu_expert_cache.h). Setting
// gpu_pin_host_experts; issues 26 and 27.
//
// Why: the checkpoint's experts are views into a read-only MAP_PRIVATE file
// map. Registering that map with the driver in place (cudaHostRegister)
// spun in the kernel for minutes on the H100 device host; reading it as
// pageable memory makes every copy a synchronous staging through the
// driver. Repacking into a second pinned image doubles host memory, which a
// 300-600 GB model cannot afford. So:
//  - copy: the host layers' experts are copied once into anonymous memory,
//    per NUMA node (numa::ExpertEngine's node pieces: each node holds its
//    row slices of every expert, huge pages advised, first touched by that
//    node's workers), each node buffer registered whole with the driver
//    (anonymous memory registers reliably), and the checkpoint's pages of
//    those experts dropped (WeightBinder::drop_copied: MADV_DONTNEED on the
//    private map, and POSIX_FADV_DONTNEED where the file stays open, GGUF),
//    so the CPU experts and the GPU's copies read the same one copy. The
//    stream's and the cache's copy lists follow the node pieces.
//    Experts that are no file map (the loader's own buffers: GPTQ/AWQ/FP8
//    repacks, --dtype conversions, synthetic models) are anonymous memory
//    already: they are registered where they are (no second copy).
//  - map: the file map registered in place (read-only registration first),
//    as before issue 26's stop-gap.
//  - off: nothing registered; copies read pageable memory.
// The choice is made once per load (choose_host_residence): copy needs a
// GPU run with host MoE layers that the stream or the cache reads, and
// room in MemAvailable; else it falls back to off with the reason said.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/moe_stream.h"
#include "numa/expert_engine.h"

namespace hmoe {

struct Settings;

enum class HostResidence { copy, map, off };

// copy, map, off; "1" reads as map and "0" as off (the setting's earlier
// boolean). Anything else: Error(invalid_argument) naming `where`.
HostResidence parse_host_residence(const std::string& where, const std::string& value);
// The setting gpu_pin_host_experts of s (errors name its flag or variable).
HostResidence host_residence_of(const Settings& s);
const char* host_residence_name(HostResidence r);

// MemAvailable of /proc/meminfo in bytes; -1 when unknown.
int64_t mem_available_bytes();

struct HostResidenceChoice {
  HostResidence asked = HostResidence::copy;
  HostResidence chosen = HostResidence::off;
  bool gpu_reads = false;   // a GPU run whose stream or cache reads host experts
  uint64_t bytes = 0;       // the host layers' expert bytes (what copy moves)
  uint64_t reserve = 0;     // host memory kept free beside them (other host buffers + 1 GiB)
  int64_t available = -1;   // MemAvailable when chosen; -1 unknown
  std::string why;          // one clause: why this residence
  std::string describe() const;  // one line for the load log and hmoe plan
};

// The residence of this load. gpu_reads false: nothing to register (the
// CPU engine keeps its views, or its node copies on several nodes); asked
// copy without room (bytes + reserve > available): off, naming the
// shortfall. available < 0 (unknown): copy goes ahead.
HostResidenceChoice choose_host_residence(HostResidence asked, bool gpu_reads, uint64_t bytes, uint64_t other_host_bytes, int64_t available);

// What the copy residence did, summed over the host layers (the load log).
struct HostResidenceStats {
  int64_t layers = 0;
  uint64_t copied_bytes = 0;      // into node buffers
  uint64_t registered_bytes = 0;  // of those, registered with the driver
  int64_t registrations = 0;
  uint64_t dropped_bytes = 0;     // checkpoint pages dropped (file maps)
  uint64_t in_place_bytes = 0;    // experts in the loader's own buffers (no file map): registered where they are, not copied
  int64_t in_place_layers = 0;
  double copy_s = 0, register_s = 0, drop_s = 0;
  std::string refused;            // the driver's answer when it refused a registration
  std::string describe() const;
};

// The page-rounded, merged ranges of the mats' bytes (data, scales, zeros):
// what registering them in place covers.
std::vector<numa::ExpertEngine::Buffer> host_ranges(const std::vector<cpu::Mat>& mats);

// Registers each buffer whole (portable, read-write: anonymous memory) and
// appends the registrations to `out`. On a refusal the ones made here are
// released, *why says the driver's answer, and false is returned.
bool register_host_buffers(const std::vector<numa::ExpertEngine::Buffer>& buffers, std::vector<gpu::HostRegistration>& out, std::string* why);

}  // namespace hmoe
