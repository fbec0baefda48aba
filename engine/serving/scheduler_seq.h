// Scheduler::Seq, one running or waiting request as the engine thread sees
// it; private to engine/serving/scheduler*.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/serving/scheduler.h"

namespace hmoe {

struct Scheduler::Seq {
  explicit Seq(std::unique_ptr<SeqRequest> r) : req(std::move(r)), sampler(req->sampling), tokens(req->prompt) {}
  std::unique_ptr<SeqRequest> req;
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t generated = 0;
  int64_t computed = 0;  // tokens whose K/V are in the cache
  int64_t prompt_scored = 0;  // prompt_logprobs: positions whose logits have scored the next prompt token
  int kv_seq = -1;
  std::vector<int64_t> snapshot_at;  // hybrid models: positions to snapshot the state at (see scheduler.h)
  // Speculative decoding: tokens the MTP head proposed after the last one
  // (verified by the next step), how many of them this step's chunk holds,
  // and that chunk's state checkpoints (after 1..verify of its tokens).
  std::vector<int32_t> draft;
  int64_t verify = 0;
  std::vector<std::vector<uint8_t>> rollback;
  bool done = false;
  bool admitted_once = false;
  std::span<const int32_t> prompt() const { return {tokens.data(), req->prompt.size()}; }
  std::span<const int32_t> output() const { return {tokens.data() + req->prompt.size(), static_cast<size_t>(generated)}; }
  bool greedy() const { return req->sampling.temperature == 0; }
};

}  // namespace hmoe
