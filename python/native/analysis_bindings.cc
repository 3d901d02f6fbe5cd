// flexnpu._native analysis bindings: HLO bytes in, plain dicts out (the typed Python wrapper
// lives in flexnpu/analysis.py). Errors become ValueError; nothing else crosses the boundary.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <string_view>

#include "xla_passes/analysis.h"
#include "xla_passes/roofline.h"

namespace nb = nanobind;

namespace flexnpu::python {
namespace {

using xla_passes::AnalysisOptions;
using xla_passes::Classification;
using xla_passes::DeviceSpec;
using xla_passes::ExecutableProfile;

nb::list Buffers(const std::vector<xla_passes::BufferInfo>& buffers) {
  nb::list out;
  for (const auto& b : buffers) {
    nb::dict d;
    d["name"] = b.name;
    d["index"] = b.index;
    d["shape"] = b.shape;
    d["bytes"] = b.bytes;
    out.append(d);
  }
  return out;
}

nb::list Kernels(const std::vector<xla_passes::KernelInfo>& kernels) {
  nb::list out;
  for (const auto& k : kernels) {
    nb::dict d;
    d["name"] = k.name;
    d["opcode"] = k.opcode;
    d["flops"] = k.flops;
    d["bytes"] = k.bytes;
    out.append(d);
  }
  return out;
}

nb::dict ProfileDict(const ExecutableProfile& p) {
  nb::dict d;
  d["module_name"] = p.module_name;
  d["flops"] = p.flops;
  d["transcendentals"] = p.transcendentals;
  d["bytes_accessed"] = p.bytes_accessed;
  d["bytes_read"] = p.bytes_read;
  d["bytes_written"] = p.bytes_written;
  d["arithmetic_intensity"] = p.arithmetic_intensity;
  d["dot_flops"] = p.dot_flops;
  d["conv_flops"] = p.conv_flops;
  d["elementwise_flops"] = p.elementwise_flops;
  d["reduce_flops"] = p.reduce_flops;
  d["other_flops"] = p.other_flops;
  d["dot_count"] = p.dot_count;
  d["gemv_dot_count"] = p.gemv_dot_count;
  d["gemv_dot_flops"] = p.gemv_dot_flops;
  d["state_append_count"] = p.state_append_count;
  d["state_append_buffer_bytes"] = p.state_append_buffer_bytes;
  d["state_append_update_bytes"] = p.state_append_update_bytes;
  d["convert_overhead_bytes"] = p.convert_overhead_bytes;
  d["convert_overhead_flops"] = p.convert_overhead_flops;
  d["while_loops"] = p.while_loops;
  d["while_loops_unknown_trip_count"] = p.while_loops_unknown_trip_count;
  d["max_trip_count"] = p.max_trip_count;
  d["custom_calls"] = p.custom_calls;
  d["instruction_count"] = p.instruction_count;
  d["top_level_kernels"] = p.top_level_kernels;
  d["fusion_count"] = p.fusion_count;
  d["parameter_bytes"] = p.parameter_bytes;
  d["output_bytes"] = p.output_bytes;
  d["largest_parameters"] = Buffers(p.largest_parameters);
  d["largest_outputs"] = Buffers(p.largest_outputs);
  nb::list aliased;
  for (const auto& a : p.aliased) {
    nb::dict e;
    e["parameter_number"] = a.parameter_number;
    e["parameter_index"] = a.parameter_index;
    e["output_index"] = a.output_index;
    e["must_alias"] = a.must_alias;
    e["bytes"] = a.bytes;
    aliased.append(e);
  }
  d["aliased"] = aliased;
  d["aliased_bytes"] = p.aliased_bytes;
  d["heaviest_by_bytes"] = Kernels(p.heaviest_by_bytes);
  d["heaviest_by_flops"] = Kernels(p.heaviest_by_flops);
  d["from_config_wrapper"] = p.from_config_wrapper;
  return d;
}

nb::dict DeviceDict(const DeviceSpec& s) {
  nb::dict d;
  d["name"] = s.name;
  d["peak_flops"] = s.peak_flops;
  d["mem_bandwidth"] = s.mem_bandwidth;
  d["small_work_s"] = s.small_work_s;
  d["native_low_precision"] = s.native_low_precision;
  d["source"] = s.source;
  d["ridge"] = s.ridge();
  d["memory_bytes"] = s.memory_bytes;
  d["link"] = s.link;
  d["eff_compute"] = s.eff_compute;
  d["eff_memory"] = s.eff_memory;
  d["efficiency_source"] = s.efficiency_source;
  return d;
}

nb::dict LinkDict(const xla_passes::LinkSpec& l) {
  nb::dict d;
  d["name"] = l.name;
  d["bytes_per_s"] = l.bytes_per_s;
  d["latency_s"] = l.latency_s;
  d["source"] = l.source;
  return d;
}

nb::dict ClassificationDict(const Classification& c) {
  nb::dict d;
  d["phase"] = std::string(xla_passes::PhaseName(c.phase));
  d["device"] = c.device;
  d["ridge"] = c.ridge;
  d["arithmetic_intensity"] = c.arithmetic_intensity;
  d["flops"] = c.flops;
  d["bytes"] = c.bytes;
  d["compute_time_s"] = c.compute_time_s;
  d["memory_time_s"] = c.memory_time_s;
  d["roofline_time_s"] = c.roofline_time_s;
  d["ridge_ratio"] = c.ridge_ratio;
  return d;
}

ExecutableProfile ProfileFromBytes(nb::bytes data, bool xla_compatible) {
  AnalysisOptions options;
  options.xla_compatible = xla_compatible;
  const std::string_view view(static_cast<const char*>(data.data()), data.size());
  StatusOr<ExecutableProfile> profile = [&] {
    nb::gil_scoped_release release;
    return xla_passes::AnalyzeHloProto(view, options);
  }();
  if (!profile.ok()) throw nb::value_error(profile.status().message().c_str());
  return std::move(profile).value();
}

DeviceSpec DeviceFromDict(const nb::dict& d) {
  DeviceSpec s;
  try {
    s.name = nb::cast<std::string>(d["name"]);
    s.peak_flops = nb::cast<double>(d["peak_flops"]);
    s.mem_bandwidth = nb::cast<double>(d["mem_bandwidth"]);
    s.small_work_s = nb::cast<double>(d["small_work_s"]);
    s.native_low_precision = nb::cast<bool>(d["native_low_precision"]);
  } catch (const std::exception& e) {
    throw nb::value_error((std::string("invalid device spec: ") + e.what()).c_str());
  }
  return s;
}

}  // namespace

void RegisterAnalysis(nb::module_& m) {
  m.def(
      "analyze_hlo",
      [](nb::bytes data, bool xla_compatible) {
        return ProfileDict(ProfileFromBytes(data, xla_compatible));
      },
      nb::arg("data"), nb::arg("xla_compatible") = false,
      "Profile of an HloModuleProto / HloModuleProtoWithConfig (protobuf bytes) as a dict.");
  m.def(
      "classify",
      [](nb::bytes data, const nb::dict& device, bool xla_compatible) {
        const ExecutableProfile profile = ProfileFromBytes(data, xla_compatible);
        auto c = xla_passes::Classify(profile, DeviceFromDict(device));
        if (!c.ok()) throw nb::value_error(c.status().message().c_str());
        nb::dict out;
        out["profile"] = ProfileDict(profile);
        out["classification"] = ClassificationDict(c.value());
        return out;
      },
      nb::arg("data"), nb::arg("device"), nb::arg("xla_compatible") = false,
      "Profile and roofline classification of HLO bytes on a device given as a dict.");
  m.def(
      "classify_profile",
      [](double flops, double bytes_accessed, double convert_overhead_flops,
         double convert_overhead_bytes, const nb::dict& device) {
        ExecutableProfile p;
        p.flops = flops;
        p.bytes_accessed = bytes_accessed;
        p.convert_overhead_flops = convert_overhead_flops;
        p.convert_overhead_bytes = convert_overhead_bytes;
        auto c = xla_passes::Classify(p, DeviceFromDict(device));
        if (!c.ok()) throw nb::value_error(c.status().message().c_str());
        return ClassificationDict(c.value());
      },
      nb::arg("flops"), nb::arg("bytes_accessed"), nb::arg("convert_overhead_flops"),
      nb::arg("convert_overhead_bytes"), nb::arg("device"), "Roofline classification of already computed totals.");
  m.def("device_presets", [] {
    nb::dict out;
    for (const DeviceSpec& d : xla_passes::DevicePresets()) out[d.name.c_str()] = DeviceDict(d);
    return out;
  });
  m.def("links", [] {
    nb::dict out;
    for (const auto& l : xla_passes::Links()) out[l.name.c_str()] = LinkDict(l);
    return out;
  });
  m.def(
      "modelled_seconds",
      [](const std::string& preset, double flops, double bytes) {
        auto d = xla_passes::FindDevice(preset);
        if (!d.ok()) throw nb::value_error(d.status().message().c_str());
        return xla_passes::ModelledSeconds(*d, flops, bytes);
      },
      nb::arg("preset"), nb::arg("flops"), nb::arg("bytes"),
      "The modelled duration (s) of a program on one device of a preset "
      "(xla_passes::ModelledSeconds).");
}

}  // namespace flexnpu::python
