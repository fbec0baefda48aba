#include "engine/runtime/segment_graphs.h"

#include <cctype>

namespace hmoe {

std::string kernel_short_name(std::string n) {
  if (n.rfind("void ", 0) == 0) n.erase(0, 5);
  int depth = 0;
  for (size_t i = 0; i < n.size(); ++i) {  // the parameter list: the first '(' outside template brackets, not "(anonymous"
    if (n[i] == '<') ++depth;
    if (n[i] == '>') --depth;
    if (n[i] == '(' && depth == 0 && n.compare(i, 10, "(anonymous") != 0) {
      n.erase(i);
      break;
    }
  }
  for (size_t p; (p = n.find("(anonymous namespace)::")) != std::string::npos;) n.erase(p, 23);
  std::string out;
  for (size_t i = 0; i < n.size();) {  // drops every "qualifier::"
    size_t j = i;
    while (j < n.size() && (std::isalnum(static_cast<unsigned char>(n[j])) || n[j] == '_')) ++j;
    if (j > i && n.compare(j, 2, "::") == 0) {
      i = j + 2;
      continue;
    }
    if (j == i) ++j;
    out.append(n, i, j - i);
    i = j;
  }
  return out;
}


void SegmentGraphs::run(const std::vector<const void*>& key, size_t index, gpu::Stream& s, const std::function<void()>& enqueue) {
  auto it = sets_.find(key);
  if (it == sets_.end()) {
    if (sets_.size() >= kMaxKeys) clear();
    it = sets_.emplace(key, std::vector<std::unique_ptr<gpu::Graph>>{}).first;
  }
  auto& graphs = it->second;
  if (graphs.size() <= index) graphs.resize(index + 1);
  if (!graphs[index]) {
    auto g = std::make_unique<gpu::Graph>();
    g->begin_capture(s);
    try {
      enqueue();
    } catch (...) {
      try {
        g->end_capture(s);  // leaves capture mode; the partial graph is dropped
      } catch (...) {
      }
      throw;
    }
    g->end_capture(s);
    graphs[index] = std::move(g);
    ++captures_;
  }
  graphs[index]->launch(s);
  last_ = &graphs;
}

size_t SegmentGraphs::last_graphs() const {
  size_t n = 0;
  if (last_)
    for (const auto& g : *last_) n += g != nullptr;
  return n;
}

std::vector<std::string> SegmentGraphs::last_kernels() const {
  std::vector<std::string> k;
  if (last_)
    for (const auto& g : *last_)
      if (g) k.insert(k.end(), g->kernels().begin(), g->kernels().end());
  return k;
}

}  // namespace hmoe
