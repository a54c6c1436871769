// Shared definitions of the commlib core: dtypes, errors, small helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "commlib/c_api.h"

namespace commlib {

// An error that carries one of the COMMLIB_ERR_* codes of c_api.h.
class Error : public std::runtime_error {
 public:
  Error(int code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

size_t dtype_size(int dtype);           // 0 for unknown dtypes
const char* dtype_name(int dtype);
const char* op_type_name(int op_type);
const char* reduce_op_name(int op);
bool is_valid_dtype(int dtype);
bool is_float_dtype(int dtype);        // float16/bfloat16/float32/float64
bool is_half_dtype(int dtype);         // float16/bfloat16 (reduced via fp32)

std::string shape_str(const std::vector<int64_t>& shape);
std::string ranks_str(const std::vector<int>& ranks);  // "[0, 2]"
int64_t num_elements(const std::vector<int64_t>& shape);

}  // namespace commlib
