#include "base/common.h"

namespace commlib {

size_t dtype_size(int dtype) {
  switch (dtype) {
    case COMMLIB_UINT8: case COMMLIB_INT8: case COMMLIB_BOOL: return 1;
    case COMMLIB_FLOAT16: case COMMLIB_BFLOAT16: case COMMLIB_INT16: case COMMLIB_UINT16: return 2;
    case COMMLIB_INT32: case COMMLIB_FLOAT32: case COMMLIB_UINT32: return 4;
    case COMMLIB_INT64: case COMMLIB_FLOAT64: case COMMLIB_UINT64: return 8;
    default: return 0;
  }
}

const char* dtype_name(int dtype) {
  switch (dtype) {
    case COMMLIB_UINT8: return "uint8";
    case COMMLIB_INT8: return "int8";
    case COMMLIB_INT32: return "int32";
    case COMMLIB_INT64: return "int64";
    case COMMLIB_FLOAT16: return "float16";
    case COMMLIB_BFLOAT16: return "bfloat16";
    case COMMLIB_FLOAT32: return "float32";
    case COMMLIB_FLOAT64: return "float64";
    case COMMLIB_BOOL: return "bool";
    case COMMLIB_INT16: return "int16";
    case COMMLIB_UINT16: return "uint16";
    case COMMLIB_UINT32: return "uint32";
    case COMMLIB_UINT64: return "uint64";
    default: return "unknown";
  }
}

const char* op_type_name(int op_type) {
  switch (op_type) {
    case COMMLIB_OP_ALLREDUCE: return "allreduce";
    case COMMLIB_OP_ALLGATHER: return "allgather";
    case COMMLIB_OP_BROADCAST: return "broadcast";
    case COMMLIB_OP_ALLTOALL: return "alltoall";
    case COMMLIB_OP_REDUCESCATTER: return "reducescatter";
    case COMMLIB_OP_BARRIER: return "barrier";
    case COMMLIB_OP_ADD_PROCESS_SET: return "add_process_set";
    case COMMLIB_OP_REMOVE_PROCESS_SET: return "remove_process_set";
    case COMMLIB_OP_JOIN: return "join";
    case COMMLIB_OP_ABORT: return "abort";
    default: return "unknown";
  }
}

const char* reduce_op_name(int op) {
  switch (op) {
    case COMMLIB_SUM: return "Sum";
    case COMMLIB_AVERAGE: return "Average";
    case COMMLIB_MIN: return "Min";
    case COMMLIB_MAX: return "Max";
    case COMMLIB_PRODUCT: return "Product";
    case COMMLIB_ADASUM: return "Adasum";
    default: return "unknown";
  }
}

bool is_valid_dtype(int dtype) { return dtype_size(dtype) != 0; }

bool is_float_dtype(int dtype) {
  return dtype == COMMLIB_FLOAT16 || dtype == COMMLIB_BFLOAT16 ||
         dtype == COMMLIB_FLOAT32 || dtype == COMMLIB_FLOAT64;
}

bool is_half_dtype(int dtype) {
  return dtype == COMMLIB_FLOAT16 || dtype == COMMLIB_BFLOAT16;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string ranks_str(const std::vector<int>& ranks) {
  return shape_str(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

int64_t num_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace commlib
