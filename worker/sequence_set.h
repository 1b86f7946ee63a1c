// SequenceSet: the sequences one worker request streams (the request and its siblings, OpenAI n /
// best_of: worker.proto "Sibling sequences"), for the roles that stream tokens (mixed, decode).
// Index 0 is the request itself, index i its sibling i - 1; SequenceOwners maps a sibling's
// engine id back to its request. Thread-compatible: the roles use them on the loop thread only.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/request.h"

namespace tandem {

struct SequenceSet {
  std::vector<std::string> ids;  // index -> engine id
  std::vector<bool> ended;
  int live = 0;
  bool aborted = false;  // the whole request was aborted: the stream ends ABORTED

  static SequenceSet For(const std::string& request_id,
                         const std::vector<SiblingRequest>& siblings);
  // Index of engine sequence `id`, -1 if it is not one of these.
  int IndexOf(const std::string& id) const;
  // Marks sequence `index` ended (again: no-op); true when no sequence is live any more.
  bool End(int index);
  // The engine ids of the sequences still live.
  std::vector<std::string> LiveIds() const;
};

class SequenceOwners {
 public:
  void Add(const SequenceSet& set);     // every sibling of set.ids[0]
  void Remove(const SequenceSet& set);  // every sibling of set.ids[0]
  // The request an engine id belongs to: itself unless it is a registered sibling.
  const std::string& RequestOf(const std::string& id) const;

 private:
  absl::flat_hash_map<std::string, std::string> owner_;  // sibling id -> request id
};

}  // namespace tandem
