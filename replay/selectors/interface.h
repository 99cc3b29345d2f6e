// How a table picks the items of a sample. A selector sees slots (indices
// in [0, capacity) of the table's ring of items) and their priorities; it
// knows nothing about the items themselves.
//
// Locking: none inside; the owning Table calls every method under its mutex.
// No method allocates after construction.
#ifndef TROUPE_REPLAY_SELECTORS_INTERFACE_H_
#define TROUPE_REPLAY_SELECTORS_INTERFACE_H_

#include <cstdint>
#include <random>

namespace troupe::replay {

class Selector {
 public:
  struct Selection {
    int64_t slot = -1;
    double probability = 0;  // chance this slot had of being picked
  };

  virtual ~Selector() = default;

  // Adds an empty slot with `priority` (finite, >= 0).
  virtual void Insert(int64_t slot, double priority) = 0;
  // Changes a present slot's priority.
  virtual void Update(int64_t slot, double priority) = 0;
  // Removes a present slot.
  virtual void Remove(int64_t slot) = 0;
  // Picks one present slot; requires size() > 0.
  virtual Selection Select(std::mt19937_64& rng) = 0;
  virtual int64_t size() const = 0;
  // True if the table must remove each item as soon as it is sampled (FIFO queues).
  virtual bool SampleOnce() const { return false; }
  // True if Selection::probability differs between items (importance weights apply).
  virtual bool Prioritized() const { return false; }
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SELECTORS_INTERFACE_H_
