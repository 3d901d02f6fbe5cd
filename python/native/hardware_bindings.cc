// flexnpu._native hardware bindings: AscendCL / NVML discovery, binding and the telemetry
// sampler (pjrt_flexnpu/hardware) for flexnpu.hardware and `flexnpu devices`. Library failures
// become RuntimeError with the layer's message; bad arguments ValueError.
#ifdef FLEXNPU_HAVE_HARDWARE
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "pjrt_flexnpu/hardware/hardware.h"

namespace nb = nanobind;

namespace flexnpu::python {
namespace {

namespace hw = flexnpu::hardware;

void Check(const Status& s) {
  if (s.ok()) return;
  if (s.code() == Code::kInvalidArgument) throw nb::value_error(s.message().c_str());
  throw std::runtime_error(s.message());
}

nb::object Percent(int value) {
  return value == hw::kUnsupported ? nb::none() : nb::cast(value);
}

nb::object Bytes(int64_t value) { return value < 0 ? nb::none() : nb::cast(value); }

nb::dict SampleToDict(const hw::Sample& s) {
  nb::dict d;
  d["index"] = s.index;
  d["memory_total_bytes"] = Bytes(s.memory_total_bytes);
  d["memory_free_bytes"] = Bytes(s.memory_free_bytes);
  nb::dict u;
  u["compute"] = Percent(s.utilization.compute);
  u["memory"] = Percent(s.utilization.memory);
  u["cube"] = Percent(s.utilization.cube);
  u["vector"] = Percent(s.utilization.vector);
  d["utilization"] = u;
  return d;
}

nb::dict InfoToDict(const hw::DeviceInfo& info) {
  nb::dict d = SampleToDict(info.sample);
  d["index"] = info.index;
  d["physical_index"] = info.physical_index < 0 ? nb::none() : nb::cast(info.physical_index);
  d["source"] = hw::SourceKindName(info.source);
  d["name"] = info.name;
  d["preset"] = info.preset.empty() ? nb::none() : nb::cast(info.preset);
  d["pci_bus_id"] = info.pci_bus_id.empty() ? nb::none() : nb::cast(info.pci_bus_id);
  d["ai_cores"] = info.ai_cores < 0 ? nb::none() : nb::cast(info.ai_cores);
  return d;
}

struct PySource {
  std::shared_ptr<hw::TelemetrySource> handle;
  hw::TelemetrySource* get() const {
    if (handle == nullptr) throw std::runtime_error("hardware source is closed");
    return handle.get();
  }
};

struct PySampler {
  std::unique_ptr<hw::TelemetrySampler> handle;
  hw::TelemetrySampler* get() const {
    if (handle == nullptr) throw std::runtime_error("hardware sampler is closed");
    return handle.get();
  }
};

}  // namespace

void RegisterHardware(nb::module_& m) {
  m.def("hardware_preset_for_name", [](const std::string& name) { return hw::PresetForName(name); },
        nb::arg("name"), "Roofline preset of a SoC / GPU name ('' when none).");

  nb::class_<PySource>(m, "HardwareSource")
      .def_prop_ro("kind", [](const PySource& s) { return hw::SourceKindName(s.get()->kind()); })
      .def_prop_ro("library", [](const PySource& s) { return s.get()->library(); })
      .def_prop_ro("device_count", [](const PySource& s) { return s.get()->device_count(); })
      .def_prop_ro("notes", [](const PySource& s) { return s.get()->notes(); })
      .def("describe",
           [](PySource& s, int index) {
             auto info = s.get()->Describe(index);
             Check(info.status());
             return InfoToDict(*info);
           },
           nb::arg("index"))
      .def("read",
           [](PySource& s, int index) {
             auto sample = s.get()->Read(index);
             Check(sample.status());
             return SampleToDict(*sample);
           },
           nb::arg("index"))
      .def("bind", [](PySource& s, int index) { Check(s.get()->Bind(index)); }, nb::arg("index"))
      .def("unbind", [](PySource& s, int index) { Check(s.get()->Unbind(index)); },
           nb::arg("index"))
      .def("bound", [](const PySource& s, int index) { return s.get()->bound(index); },
           nb::arg("index"))
      .def("close", [](PySource& s) { s.handle.reset(); },
           "Finalise the library (aclFinalize / nvmlShutdown) once no sampler holds it.");

  m.def(
      "hardware_open",
      [](const std::string& mode, const std::string& ascendcl_library,
         const std::string& nvml_library, const std::string& dcmi_library,
         const std::string& cuda_library, bool backend_is_cuda) {
        auto parsed = hw::ParseTelemetryMode(mode);
        Check(parsed.status());
        hw::SourceOptions options;
        options.mode = *parsed;
        options.ascendcl_library = ascendcl_library;
        options.nvml_library = nvml_library;
        options.dcmi_library = dcmi_library;
        options.cuda_library = cuda_library;
        options.backend_is_cuda = backend_is_cuda;
        auto opened = hw::OpenTelemetry(options);
        Check(opened.status());
        nb::object source = nb::none();
        if (opened->source != nullptr) {
          source = nb::cast(PySource{std::shared_ptr<hw::TelemetrySource>(
              std::move(opened->source))});
        }
        return std::make_tuple(source, opened->fallback);
      },
      nb::arg("mode") = "auto", nb::arg("ascendcl_library") = "", nb::arg("nvml_library") = "",
      nb::arg("dcmi_library") = "", nb::arg("cuda_library") = "",
      nb::arg("backend_is_cuda") = false,
      "Opens the telemetry source: (HardwareSource or None, auto's fallback line).");

  nb::class_<PySampler>(m, "HardwareSampler")
      .def("__init__",
           [](PySampler* self, PySource& source, double period_s) {
             const auto period = std::chrono::milliseconds(static_cast<int64_t>(period_s * 1000));
             source.get();
             auto sampler = hw::TelemetrySampler::Start(source.handle, period);
             Check(sampler.status());
             new (self) PySampler{std::move(*sampler)};
           },
           nb::arg("source"), nb::arg("period_s"))
      .def("latest",
           [](const PySampler& s) {
             nb::list out;
             for (const auto& sample : s.get()->Latest()) out.append(SampleToDict(sample));
             return out;
           })
      .def("refresh", [](PySampler& s) {
        nb::gil_scoped_release release;
        s.get()->RefreshNow();
      })
      .def_prop_ro("rounds", [](const PySampler& s) { return s.get()->rounds(); })
      .def_prop_ro("errors", [](const PySampler& s) { return s.get()->errors(); })
      .def_prop_ro("last_error", [](const PySampler& s) { return s.get()->last_error(); })
      .def("close", [](PySampler& s) {
        nb::gil_scoped_release release;
        s.handle.reset();
      });
}

}  // namespace flexnpu::python
#endif  // FLEXNPU_HAVE_HARDWARE
