// Speculative decoding in the scheduler (see scheduler.h): the MTP head's
// pass after each step, drafting, and settling a verified chunk.
//
// Rollback of a rejected draft: the full-attention K/V past the accepted
// tokens are simply dropped (truncate: nothing reads a position before it is
// written again); the linear-attention state cannot be undone, so the verify
// step asks the layers for a checkpoint after each of its tokens but the
// last (KvCache state checkpoints) and the accepted one is copied back. The
// alternative, re-running the accepted tokens after a rejection, would cost
// a second forward of the whole model on every rejection; a checkpoint costs
// a copy of the state (one sequence's seq_state) per drafted token.
#include <algorithm>
#include <cstring>

#include "engine/loading/model.h"
#include "engine/serving/logits.h"
#include "engine/serving/scheduler_seq.h"

namespace hmoe {

void Scheduler::plan_rollback(Seq& s) {
  const int64_t bytes = kv_.layout().seq_state_bytes;
  if (bytes == 0) return;
  s.rollback.resize(static_cast<size_t>(s.verify));
  for (int64_t i = 0; i < s.verify; ++i) {
    auto& buf = s.rollback[static_cast<size_t>(i)];
    buf.resize(static_cast<size_t>(bytes));
    kv_.add_state_checkpoint(s.kv_seq, s.computed + i + 1, buf.data());
  }
}

void Scheduler::settle_verify(Seq& s, int64_t computed_before) {
  // Tokens sent this step: the accepted drafts and the one after them.
  const int64_t emitted = static_cast<int64_t>(s.tokens.size()) - computed_before - 1;
  spec_drafted_ += s.verify;
  spec_accepted_ += std::max<int64_t>(emitted - 1, 0);
  const int64_t verified = s.verify;
  s.verify = 0;
  s.draft.clear();
  if (s.done || s.kv_seq < 0) return;
  s.computed = computed_before + emitted;  // the last token and the accepted drafts
  if (emitted < verified + 1) {
    if (kv_.layout().seq_state_bytes > 0)
      std::memcpy(kv_.seq_state(s.kv_seq), s.rollback[static_cast<size_t>(emitted - 1)].data(), static_cast<size_t>(kv_.layout().seq_state_bytes));
    kv_.truncate(s.kv_seq, s.computed);
  }
  kv_.commit(s.kv_seq, s.tokens, s.computed);
}

void Scheduler::draft_tokens(const std::vector<SpecItem>& items) {
  const int64_t n_max = model_.speculative_tokens(), H = model_.config().hidden_size, V = model_.config().vocab_size;
  const int64_t bs = kv_.block_size();
  // Drafts a sequence may take: it is decoding greedily, has tokens left to
  // generate and KV room for the head's draft rows.
  auto want = [&](const Seq& s) -> int64_t {
    if (!s.greedy() || static_cast<int64_t>(s.tokens.size()) != s.computed + 1) return 0;
    int64_t n = std::min(n_max, s.req->max_tokens - s.generated - 1);
    const int64_t room = kv_.capacity(s.kv_seq) + kv_.free_blocks() * bs - s.computed;  // positions from `computed` on
    return std::max<int64_t>(std::min(n, room + 1), 0);
  };
  if (cfg_.draft_override) {  // benchmarks: drafts from outside, no head
    for (const SpecItem& it : items)
      if (const int64_t n = want(*it.s); n > 0) {
        it.s->draft = cfg_.draft_override(it.s->tokens, n);
        if (static_cast<int64_t>(it.s->draft.size()) > n) it.s->draft.resize(static_cast<size_t>(n));
      }
    return;
  }
  // Pass 1: the head over every position this step computed (its K/V for
  // later steps), from the main model's hidden states; the last position of
  // a decoding sequence drafts its first token.
  const std::vector<float>& hid = model_.hidden();
  Batch b;
  std::vector<float> in, logits, out;
  struct Drafting {
    Seq* s;
    int64_t n;
  };
  std::vector<Drafting> drafting;
  for (const SpecItem& it : items) {
    Seq& s = *it.s;
    const int64_t n = want(s);
    for (int64_t p = it.computed_before; p < s.computed; ++p) {
      const bool last = p + 1 == s.computed && n > 0;
      b.add(s.tokens[static_cast<size_t>(p + 1)], s.kv_seq, p, last);
      const float* h = hid.data() + (it.row0 + p - it.computed_before) * H;
      in.insert(in.end(), h, h + H);
    }
    if (n > 0) drafting.push_back({&s, n});
  }
  if (b.tokens.empty()) return;
  try {
    model_.forward_mtp(b, in.data(), kv_, logits, out);
    for (size_t k = 0; k < drafting.size(); ++k) drafting[k].s->draft = {argmax(logits.data() + static_cast<int64_t>(k) * V, V)};
    // Further drafts: one row per sequence, from the head's own last hidden state.
    for (int64_t i = 2; i <= n_max; ++i) {
      // Another sequence's draft rows may have taken the blocks this one counted on.
      std::erase_if(drafting, [&](const Drafting& d) {
        return d.n < i || (kv_.capacity(d.s->kv_seq) <= d.s->computed + i - 2 && kv_.free_blocks() == 0);
      });
      if (drafting.empty()) break;
      b.clear();
      in.clear();
      for (size_t k = 0; k < drafting.size(); ++k) {
        Seq& s = *drafting[k].s;
        const int64_t pos = s.computed + i - 2;
        kv_.reserve(s.kv_seq, pos + 1);
        b.add(s.draft.back(), s.kv_seq, pos, true);
        in.insert(in.end(), out.begin() + static_cast<int64_t>(k) * H, out.begin() + static_cast<int64_t>(k + 1) * H);
      }
      model_.forward_mtp(b, in.data(), kv_, logits, out);
      for (size_t k = 0; k < drafting.size(); ++k) drafting[k].s->draft.push_back(argmax(logits.data() + static_cast<int64_t>(k) * V, V));
    }
  } catch (const std::exception& e) {
    for (const SpecItem& it : items) finish(*it.s, FinishReason::error, e.what());
  }
}

}  // namespace hmoe
