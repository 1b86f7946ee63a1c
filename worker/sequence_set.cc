#include "worker/sequence_set.h"

namespace tandem {

SequenceSet SequenceSet::For(const std::string& request_id,
                             const std::vector<SiblingRequest>& siblings) {
  SequenceSet set;
  set.ids.push_back(request_id);
  for (const SiblingRequest& s : siblings) set.ids.push_back(s.id);
  set.ended.assign(set.ids.size(), false);
  set.live = static_cast<int>(set.ids.size());
  return set;
}

int SequenceSet::IndexOf(const std::string& id) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return static_cast<int>(i);
  }
  return -1;
}

bool SequenceSet::End(int index) {
  if (index >= 0 && index < static_cast<int>(ended.size()) && !ended[index]) {
    ended[index] = true;
    --live;
  }
  return live == 0;
}

std::vector<std::string> SequenceSet::LiveIds() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ended[i]) out.push_back(ids[i]);
  }
  return out;
}

void SequenceOwners::Add(const SequenceSet& set) {
  for (size_t i = 1; i < set.ids.size(); ++i) owner_[set.ids[i]] = set.ids[0];
}

void SequenceOwners::Remove(const SequenceSet& set) {
  for (size_t i = 1; i < set.ids.size(); ++i) owner_.erase(set.ids[i]);
}

const std::string& SequenceOwners::RequestOf(const std::string& id) const {
  auto it = owner_.find(id);
  return it == owner_.end() ? id : it->second;
}

}  // namespace tandem
