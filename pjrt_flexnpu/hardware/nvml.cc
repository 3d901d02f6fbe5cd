// NVIDIA GPUs through NVML (libnvidia-ml.so.1). The runtime numbers GPUs by CUDA ordinal,
// NVML by its own index, and the two orders differ (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES):
// each CUDA ordinal's PCI bus id comes from the CUDA driver (cuDeviceGetPCIBusId) and selects
// the NVML handle (nvmlDeviceGetHandleByPciBusId_v2).
#include <cstdio>
#include <utility>

#include "pjrt_flexnpu/hardware/hardware.h"
#include "pjrt_flexnpu/hardware/library.h"
#include "pjrt_flexnpu/hardware/vendor_api.h"

namespace flexnpu::hardware {
namespace {

struct NvmlApi {
  decltype(&::nvmlInit_v2) init = nullptr;
  decltype(&::nvmlShutdown) shutdown = nullptr;
  decltype(&::nvmlErrorString) error_string = nullptr;
  decltype(&::nvmlDeviceGetCount_v2) get_count = nullptr;
  decltype(&::nvmlDeviceGetHandleByIndex_v2) handle_by_index = nullptr;
  decltype(&::nvmlDeviceGetHandleByPciBusId_v2) handle_by_bus_id = nullptr;
  decltype(&::nvmlDeviceGetName) get_name = nullptr;
  decltype(&::nvmlDeviceGetPciInfo_v3) get_pci_info = nullptr;
  decltype(&::nvmlDeviceGetMemoryInfo) get_memory = nullptr;
  decltype(&::nvmlDeviceGetUtilizationRates) get_utilization = nullptr;
  decltype(&::nvmlDeviceGetIndex) get_index = nullptr;  // optional
};

struct Gpu {
  nvmlDevice_t handle = nullptr;
  std::string name;
  std::string bus_id;
  int nvml_index = -1;
};

// The PCI bus id of every CUDA ordinal, or an error saying why not.
StatusOr<std::vector<std::string>> CudaBusIds(const std::string& path) {
  auto cuda = Library::Open("libcuda.so.1", {path.empty() ? "libcuda.so.1" : path});
  if (!cuda.ok()) return cuda.status();
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGetCount) get_count = nullptr;
  decltype(&::cuDeviceGet) get = nullptr;
  decltype(&::cuDeviceGetPCIBusId) bus_id = nullptr;
  if (!cuda->Bind("cuInit", &init) || !cuda->Bind("cuDeviceGetCount", &get_count) ||
      !cuda->Bind("cuDeviceGet", &get) || !cuda->Bind("cuDeviceGetPCIBusId", &bus_id)) {
    return FailedPrecondition(cuda->description() + ": missing CUDA driver symbols");
  }
  const auto fail = [&](const char* call, CUresult r) {
    return Internal(cuda->description() + ": " + call + " failed with CUDA error " +
                    std::to_string(r));
  };
  if (CUresult r = init(0); r != 0) return fail("cuInit", r);
  int count = 0;
  if (CUresult r = get_count(&count); r != 0) return fail("cuDeviceGetCount", r);
  std::vector<std::string> out;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice device = 0;
    if (CUresult r = get(&device, ordinal); r != 0) return fail("cuDeviceGet", r);
    char buffer[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE] = {};
    if (CUresult r = bus_id(buffer, sizeof(buffer), device); r != 0) {
      return fail("cuDeviceGetPCIBusId", r);
    }
    out.emplace_back(buffer);
  }
  return out;
}

class NvmlSource final : public TelemetrySource {
 public:
  NvmlSource(Library library, NvmlApi api) : library_(std::move(library)), api_(api) {}
  ~NvmlSource() override {
    if (initialised_) (void)api_.shutdown();
  }

  Status Init(const std::string& cuda_library) {
    FLEXNPU_RETURN_IF_ERROR(Check(api_.init(), "nvmlInit_v2"));
    initialised_ = true;
    unsigned int count = 0;
    FLEXNPU_RETURN_IF_ERROR(Check(api_.get_count(&count), "nvmlDeviceGetCount_v2"));
    auto bus_ids = CudaBusIds(cuda_library);
    if (bus_ids.ok()) {
      for (size_t ordinal = 0; ordinal < bus_ids->size(); ++ordinal) {
        Gpu gpu;
        const std::string& bus = (*bus_ids)[ordinal];
        FLEXNPU_RETURN_IF_ERROR(Check(api_.handle_by_bus_id(bus.c_str(), &gpu.handle),
                                      "nvmlDeviceGetHandleByPciBusId_v2", bus));
        gpus_.push_back(gpu);
      }
    } else {
      // No CUDA driver to ask: NVML's order, said once.
      notes_.push_back("CUDA ordinals unknown (" + bus_ids.status().message() +
                       "): devices in NVML index order");
      for (unsigned int i = 0; i < count; ++i) {
        Gpu gpu;
        FLEXNPU_RETURN_IF_ERROR(Check(api_.handle_by_index(i, &gpu.handle),
                                      "nvmlDeviceGetHandleByIndex_v2", std::to_string(i)));
        gpu.nvml_index = static_cast<int>(i);
        gpus_.push_back(gpu);
      }
    }
    for (Gpu& gpu : gpus_) {
      char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
      FLEXNPU_RETURN_IF_ERROR(Check(api_.get_name(gpu.handle, name, sizeof(name)),
                                    "nvmlDeviceGetName"));
      gpu.name = name;
      nvmlPciInfo_t pci{};
      FLEXNPU_RETURN_IF_ERROR(Check(api_.get_pci_info(gpu.handle, &pci), "nvmlDeviceGetPciInfo_v3"));
      gpu.bus_id = pci.busId;
      unsigned int index = 0;
      if (gpu.nvml_index < 0 && api_.get_index != nullptr &&
          api_.get_index(gpu.handle, &index) == NVML_SUCCESS) {
        gpu.nvml_index = static_cast<int>(index);
      }
    }
    return Status::Ok();
  }

  SourceKind kind() const override { return SourceKind::kNvml; }
  std::string library() const override { return library_.description(); }
  int device_count() const override { return static_cast<int>(gpus_.size()); }
  std::vector<std::string> notes() const override { return notes_; }

  StatusOr<DeviceInfo> Describe(int index) override {
    FLEXNPU_RETURN_IF_ERROR(CheckIndex(index));
    const Gpu& gpu = gpus_[index];
    DeviceInfo info;
    info.index = index;
    info.physical_index = gpu.nvml_index;
    info.source = SourceKind::kNvml;
    info.name = gpu.name;
    info.preset = PresetForName(gpu.name);
    info.pci_bus_id = gpu.bus_id;
    auto sample = Read(index);
    if (!sample.ok()) return sample.status();
    info.sample = *sample;
    return info;
  }

  StatusOr<Sample> Read(int index) override {
    FLEXNPU_RETURN_IF_ERROR(CheckIndex(index));
    Sample sample;
    sample.index = index;
    nvmlMemory_t memory{};
    FLEXNPU_RETURN_IF_ERROR(
        Check(api_.get_memory(gpus_[index].handle, &memory), "nvmlDeviceGetMemoryInfo"));
    sample.memory_total_bytes = static_cast<int64_t>(memory.total);
    sample.memory_free_bytes = static_cast<int64_t>(memory.free);
    nvmlUtilization_t utilization{};
    const nvmlReturn_t r = api_.get_utilization(gpus_[index].handle, &utilization);
    if (r == NVML_SUCCESS) {
      sample.utilization.compute = static_cast<int>(utilization.gpu);
      sample.utilization.memory = static_cast<int>(utilization.memory);
    } else if (r != NVML_ERROR_NOT_SUPPORTED) {
      FLEXNPU_RETURN_IF_ERROR(Check(r, "nvmlDeviceGetUtilizationRates"));
    }
    return sample;
  }

  Status Bind(int index) override { return CheckIndex(index); }
  Status Unbind(int index) override { return CheckIndex(index); }
  bool bound(int) const override { return false; }

 private:
  Status CheckIndex(int index) const {
    if (index < 0 || index >= device_count()) {
      return InvalidArgument("NVML device " + std::to_string(index) + " out of range [0, " +
                             std::to_string(device_count()) + ")");
    }
    return Status::Ok();
  }

  Status Check(nvmlReturn_t r, const char* call, const std::string& argument = "") const {
    if (r == NVML_SUCCESS) return Status::Ok();
    const char* text = api_.error_string != nullptr ? api_.error_string(r) : nullptr;
    std::string message = "NVML (" + library_.description() + "): " + call;
    if (!argument.empty()) message += "(" + argument + ")";
    message += " failed with NVML error " + std::to_string(static_cast<int>(r));
    if (text != nullptr && text[0] != '\0') message += ": " + std::string(text);
    return Status(r == NVML_ERROR_INVALID_ARGUMENT ? Code::kInvalidArgument
                  : r == NVML_ERROR_NOT_FOUND      ? Code::kNotFound
                                                   : Code::kInternal,
                  message);
  }

  Library library_;
  NvmlApi api_;
  bool initialised_ = false;
  std::vector<Gpu> gpus_;
  std::vector<std::string> notes_;
};

}  // namespace

StatusOr<std::unique_ptr<TelemetrySource>> OpenNvml(const SourceOptions& options) {
  auto library = Library::Open(
      "libnvidia-ml.so.1",
      {options.nvml_library.empty() ? "libnvidia-ml.so.1" : options.nvml_library});
  if (!library.ok()) {
    return Status(library.status().code(),
                  "NVML: " + library.status().message() +
                      " (set option nvml_library / FLEXNPU_NVML_LIBRARY)");
  }
  NvmlApi api;
  std::string missing;
  const auto need = [&](const char* name, auto** slot) { library->Require(name, slot, &missing); };
  need("nvmlInit_v2", &api.init);
  need("nvmlShutdown", &api.shutdown);
  need("nvmlErrorString", &api.error_string);
  need("nvmlDeviceGetCount_v2", &api.get_count);
  need("nvmlDeviceGetHandleByIndex_v2", &api.handle_by_index);
  need("nvmlDeviceGetHandleByPciBusId_v2", &api.handle_by_bus_id);
  need("nvmlDeviceGetName", &api.get_name);
  need("nvmlDeviceGetPciInfo_v3", &api.get_pci_info);
  need("nvmlDeviceGetMemoryInfo", &api.get_memory);
  need("nvmlDeviceGetUtilizationRates", &api.get_utilization);
  if (!missing.empty()) {
    return FailedPrecondition("NVML (" + library->description() + "): missing symbol(s) " +
                              missing + " (driver too old, or not NVML)");
  }
  library->Bind("nvmlDeviceGetIndex", &api.get_index);
  auto source = std::make_unique<NvmlSource>(std::move(*library), api);
  FLEXNPU_RETURN_IF_ERROR(source->Init(options.cuda_library));
  return std::unique_ptr<TelemetrySource>(std::move(source));
}

}  // namespace flexnpu::hardware
