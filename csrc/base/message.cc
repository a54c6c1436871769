#include "base/message.h"

#include <algorithm>

namespace commlib {

std::string request_key(const std::string& name, int process_set) {
  if (process_set == 0) return name;
  std::string key = name;
  key.push_back('\0');
  return key + std::to_string(process_set);
}

void encode(Writer& w, const RequestDesc& d) {
  w.put_string(d.name);
  w.put<int32_t>(d.op_type);
  w.put<int32_t>(d.dtype);
  w.put<int32_t>(d.reduce_op);
  w.put<int32_t>(d.root);
  w.put<double>(d.prescale);
  w.put<double>(d.postscale);
  w.put_vec(d.shape);
  w.put_vec(d.splits);
  w.put<int32_t>(d.group_size);
  w.put_vec(d.members);
  w.put<int32_t>(d.process_set);
  w.put<int64_t>(d.waited_us);
  w.put_string(d.note);
  w.put<int32_t>(d.device_type);
}

RequestDesc decode_request(Reader& r) {
  RequestDesc d;
  d.name = r.get_string();
  d.op_type = r.get<int32_t>();
  d.dtype = r.get<int32_t>();
  d.reduce_op = r.get<int32_t>();
  d.root = r.get<int32_t>();
  d.prescale = r.get<double>();
  d.postscale = r.get<double>();
  d.shape = r.get_vec();
  d.splits = r.get_vec();
  d.group_size = r.get<int32_t>();
  d.members = r.get_vec();
  d.process_set = r.get<int32_t>();
  d.waited_us = r.get<int64_t>();
  d.note = r.get_string();
  d.device_type = r.get<int32_t>();
  return d;
}

std::vector<std::string> describe_members(const RequestDesc& d) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < d.members.size();) {
    const int dtype = int(d.members[i]);
    const size_t ndim = size_t(d.members[i + 1]);
    std::vector<int64_t> shape(d.members.begin() + long(i + 2),
                               d.members.begin() + long(std::min(d.members.size(), i + 2 + ndim)));
    out.push_back(std::string(dtype_name(dtype)) + " " + shape_str(shape));
    i += 2 + ndim;
  }
  return out;
}

void encode(Writer& w, const Response& resp) {
  w.put<int32_t>(resp.kind);
  w.put<int32_t>(resp.op_type);
  w.put<int32_t>(resp.error_code);
  w.put<int32_t>(resp.process_set);
  w.put_string(resp.error);
  w.put<uint32_t>(uint32_t(resp.names.size()));
  for (const auto& n : resp.names) w.put_string(n);
  w.put_vec(resp.rows);
  w.put_vec(resp.bits);
  w.put<uint32_t>(uint32_t(resp.descs.size()));
  for (const auto& d : resp.descs) encode(w, d);
}

Response decode_response(Reader& r) {
  Response resp;
  resp.kind = r.get<int32_t>();
  resp.op_type = r.get<int32_t>();
  resp.error_code = r.get<int32_t>();
  resp.process_set = r.get<int32_t>();
  resp.error = r.get_string();
  const uint32_t n = r.get<uint32_t>();
  resp.names.reserve(n);
  for (uint32_t i = 0; i < n; ++i) resp.names.push_back(r.get_string());
  resp.rows = r.get_vec();
  resp.bits = r.get_vec();
  const uint32_t nd = r.get<uint32_t>();
  for (uint32_t i = 0; i < nd; ++i) resp.descs.push_back(decode_request(r));
  return resp;
}

}  // namespace commlib
