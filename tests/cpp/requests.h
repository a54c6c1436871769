// Builders of RequestDescs for the C++ unit tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/message.h"

namespace commlib_test {

inline commlib::RequestDesc request(int op_type, const std::string& name, int dtype,
                                    std::vector<int64_t> shape) {
  commlib::RequestDesc d;
  d.name = name;
  d.op_type = op_type;
  d.dtype = dtype;
  d.shape = std::move(shape);
  return d;
}

inline commlib::RequestDesc allreduce(const std::string& name, int dtype, std::vector<int64_t> shape,
                                      int reduce_op = COMMLIB_SUM) {
  commlib::RequestDesc d = request(COMMLIB_OP_ALLREDUCE, name, dtype, std::move(shape));
  d.reduce_op = reduce_op;
  return d;
}

}  // namespace commlib_test
