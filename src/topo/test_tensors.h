#ifndef MEMENTO_TOPO_TEST_TENSORS_H_
#define MEMENTO_TOPO_TEST_TENSORS_H_

// Test-only: the one-dimensional TensorMeta the planner's tests build their
// inventories from (plan_test, save_ranges_test, single_node_plan_test,
// exhaustive_test).

#include <cstdint>
#include <string>
#include <utility>

#include "memento/types.h"

namespace memento::topo::test_tensors {

inline TensorMeta Tensor(std::string name, DType dtype, int64_t numel, StateClass cls) {
  TensorMeta t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = {numel};
  t.state_class = cls;
  return t;
}

}  // namespace memento::topo::test_tensors

#endif  // MEMENTO_TOPO_TEST_TENSORS_H_
