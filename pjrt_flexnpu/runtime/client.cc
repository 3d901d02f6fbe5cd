#include "pjrt_flexnpu/runtime/client.h"

#include <mutex>
#include <set>
#include <sstream>

#include "pjrt_flexnpu/backend/factory.h"
#include "pjrt_flexnpu/base/host_memory.h"
#include "pjrt_flexnpu/base/json.h"
#include "pjrt_flexnpu/runtime/event.h"
#include "pjrt_flexnpu/runtime/executable.h"
#include "pjrt_flexnpu/runtime/executable_serialization.h"
#include "pjrt_flexnpu/runtime/ffi.h"
#include "pjrt_flexnpu/runtime/profile.h"

namespace flexnpu {
namespace {

// Named values for the inner client; `storage` keeps the strings alive.
std::vector<PJRT_NamedValue> ToNamedValues(const std::vector<NamedOption>& options) {
  std::vector<PJRT_NamedValue> out;
  for (const auto& option : options) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = option.name.c_str();
    v.name_size = option.name.size();
    if (const auto* s = std::get_if<std::string>(&option.value)) {
      v.type = PJRT_NamedValue_kString;
      v.string_value = s->c_str();
      v.value_size = s->size();
    } else if (const auto* i = std::get_if<int64_t>(&option.value)) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = *i;
      v.value_size = 1;
    } else if (const auto* d = std::get_if<double>(&option.value)) {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = static_cast<float>(*d);
      v.value_size = 1;
    } else {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = std::get<bool>(option.value);
      v.value_size = 1;
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<VirtualClient>> VirtualClient::Create(const Options& options) {
  std::unique_ptr<VirtualClient> client(new VirtualClient(options));
  FLEXNPU_RETURN_IF_ERROR(client->Init());
  return client;
}

VirtualClient::~VirtualClient() = default;

Status VirtualClient::Init() {
  auto backend_path = BackendPath(options_);
  if (!backend_path.ok()) return backend_path.status();
  const std::string& path = *backend_path;
  auto backend = OpenBackend(path);
  if (!backend.ok()) return backend.status();
  backend_ = *backend;
  const PhysicalBackend& b = *backend_;
  if (b.minor_version() > PJRT_API_MINOR && !options_.allow_newer_backend) {
    return FailedPrecondition(
        "physical backend '" + path + "' has PJRT C API 0." + std::to_string(b.minor_version()) +
        ", newer than FlexNPU's 0." + std::to_string(PJRT_API_MINOR) +
        ": FlexNPU passes its own struct sizes and a newer plugin may write output fields past "
        "them. Rebuild FlexNPU against that plugin's header, or accept the risk with create "
        "option allow_newer_backend=true (FLEXNPU_ALLOW_NEWER_BACKEND=1)");
  }

  // The owners of `backend_options` strings outlive the create call.
  const std::vector<NamedOption> inner_options = EffectiveBackendOptions(options_);
  std::vector<PJRT_NamedValue> named = ToNamedValues(inner_options);
  FLEXNPU_ASSIGN_OR_RETURN(inner_, b.CreateClient(named.data(), named.size()));
  FLEXNPU_ASSIGN_OR_RETURN(const std::string_view platform_name, b.PlatformName(inner_.get()));
  backend_platform_.assign(platform_name);
  if (options_.platform_name != "flexnpu" && options_.platform_name != backend_platform_) {
    return InvalidArgument("FlexNPU option 'platform_name' (FLEXNPU_PLATFORM_NAME) is '" +
                           options_.platform_name + "': expected 'flexnpu' or the physical "
                           "backend's platform name, which is '" + backend_platform_ + "'");
  }
  // FFI targets registered with FlexNPU (e.g. jaxlib's LAPACK kernels) reach this backend.
  FLEXNPU_RETURN_IF_ERROR(AttachFfiBackend(b, backend_platform_));
  FLEXNPU_ASSIGN_OR_RETURN(const std::string_view inner_version, b.PlatformVersion(inner_.get()));
  platform_version_ = "flexnpu 0.1.0 over " + backend_platform_ + " (" +
                      std::string(inner_version) +
                      ", PJRT C API 0." + std::to_string(b.minor_version()) + ", " +
                      // JAX's compilation cache key hashes this string: entries written over
                      // another backend build or envelope format are never looked up.
                      SerializationIdentity(b) + ")";

  FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Device*> inner_devices,
                           b.AddressableDevices(inner_.get()));
  if (inner_devices.size == 0) {
    return FailedPrecondition("physical backend '" + path + "' has no addressable devices");
  }

  // Memory kinds, in first-seen order over all physical devices.
  std::vector<std::string> kinds;
  std::vector<int> kind_ids;
  std::vector<int> default_kind;
  for (size_t p = 0; p < inner_devices.size; ++p) {
    PhysicalDevice device;
    device.device = inner_devices[p];
    FLEXNPU_ASSIGN_OR_RETURN(PJRT_DeviceDescription* const description,
                             b.Description(device.device));
    FLEXNPU_ASSIGN_OR_RETURN(device.id, b.DescriptionId(description));
    FLEXNPU_ASSIGN_OR_RETURN(const std::string_view device_kind, b.DescriptionKind(description));
    device.kind.assign(device_kind);
    if (p == 0) roofline_ = RooflineFor(backend_platform_, device.kind);

    FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Memory*> memories,
                             b.AddressableMemories(device.device));
    FLEXNPU_ASSIGN_OR_RETURN(PJRT_Memory* const default_memory, b.DefaultMemory(device.device));
    int default_index = -1;
    for (size_t m = 0; m < memories.size; ++m) {
      PJRT_Memory* memory = memories[m];
      FLEXNPU_ASSIGN_OR_RETURN(const std::string_view kind_name, b.MemoryKind(memory));
      std::string kind(kind_name);
      int kind_id = static_cast<int>(m);
      if (b.HasSlot(offsetof(PJRT_Api, PJRT_Memory_Kind_Id))) {
        FLEXNPU_ASSIGN_OR_RETURN(kind_id, b.MemoryKindId(memory));
      }
      int index = -1;
      for (size_t k = 0; k < kinds.size(); ++k) {
        if (kinds[k] == kind) index = static_cast<int>(k);
      }
      if (index < 0) {
        index = static_cast<int>(kinds.size());
        kinds.push_back(kind);
        kind_ids.push_back(kind_id);
      }
      if (device.memory_by_kind.size() <= static_cast<size_t>(index)) {
        device.memory_by_kind.resize(index + 1, nullptr);
      }
      device.memory_by_kind[index] = memory;
      kind_index_of_memory_[memory] = index;
      if (memory == default_memory) default_index = index;
    }
    if (default_index < 0) {
      return FailedPrecondition("physical device " + std::to_string(p) +
                                " has no default memory among its addressable memories");
    }
    default_kind.push_back(default_index);
    if (auto limit = b.BytesLimit(device.device); limit.ok()) device.bytes_limit = *limit;
    physical_.push_back(std::move(device));
  }
  for (auto& device : physical_) device.memory_by_kind.resize(kinds.size(), nullptr);

  const int num_virtual =
      options_.num_virtual_devices > 0 ? options_.num_virtual_devices : num_physical();
  // A backend that models its devices' time (emulate:PRESET, whose device kind names the
  // preset) stretches it by its time_scale, and may co-run executions: so does the placer.
  placement::DeviceModel model = DeviceModelFor(roofline_);
  if (auto modelled = b.ModelledTime(physical_[0].device); modelled.ok()) {
    model = StretchedDeviceModel(model, modelled->time_scale);
    model.can_overlap = modelled->co_run;  // its devices co-run as the placer's model says
  }
  std::vector<placement::DeviceModel> models(num_physical(), model);
  // Telemetry (pjrt_flexnpu/hardware): binds the physical devices to AscendCL / NVML devices;
  // an accelerator its library names gets that preset's roofline (a CPU backend keeps its own).
  std::vector<PJRT_Device*> physical_devices;
  std::vector<int64_t> physical_ids;
  for (const PhysicalDevice& d : physical_) {
    physical_devices.push_back(d.device);
    physical_ids.push_back(d.id);
  }
  auto telemetry =
      PhysicalTelemetry::Open(options_, b, physical_devices, physical_ids, backend_platform_);
  if (!telemetry.ok()) return telemetry.status();
  telemetry_ = std::move(*telemetry);
  for (int p = 0; p < num_physical() && backend_platform_ != "cpu"; ++p) {
    auto spec = xla_passes::FindDevice(telemetry_->PresetOf(p));
    if (!telemetry_->PresetOf(p).empty() && spec.ok()) models[p] = DeviceModelFor(spec.value());
  }
  AssignPhysicalMemory();
  auto placer = Placer::Create(EffectivePolicy(options_), std::move(models), num_virtual);
  if (!placer.ok()) {
    return Status(placer.status().code(), "FlexNPU placement policy: " + placer.status().message());
  }
  placer_ = std::move(*placer);
  FLEXNPU_RETURN_IF_ERROR(telemetry_->Start(placer_->core(), trace_));
  for (int v = 0; v < num_virtual; ++v) {
    const int home = placer_->HomeOf(v);
    auto device = std::make_unique<VirtualDevice>(
        this, v, home, backend_platform_,
        presents_physical() ? physical_[home].kind : std::string("virtual NPU"));
    device->memories_by_kind_.assign(kinds.size(), nullptr);
    for (size_t k = 0; k < kinds.size(); ++k) {
      if (physical_[home].memory_by_kind[k] == nullptr) continue;
      auto memory = std::make_unique<VirtualMemory>(
          device.get(), static_cast<int>(memories_.size()), static_cast<int>(k), kinds[k],
          kind_ids[k]);
      device->memories_by_kind_[k] = memory.get();
      device->memory_handles_.push_back(ToHandle<PJRT_Memory>(memory.get()));
      memory_handles_.push_back(ToHandle<PJRT_Memory>(memory.get()));
      memories_.push_back(std::move(memory));
    }
    device->default_memory_ = device->memories_by_kind_[default_kind[home]];
    device_handles_.push_back(ToHandle<PJRT_Device>(device.get()));
    topology_.descriptions_.push_back(
        ToHandle<PJRT_DeviceDescription>(device->description()));
    devices_.push_back(std::move(device));
  }
  ShareMemoryAmongVirtualDevices();
  return Status::Ok();
}

void VirtualClient::AssignPhysicalMemory() {
  // What each physical device really has: its own memory stats, else the vendor library's
  // reading; CPU devices of one host share its RAM.
  const int64_t host = backend_platform_ == "cpu" ? HostMemoryBytes() : 0;
  for (int p = 0; p < num_physical(); ++p) {
    PhysicalDevice& device = physical_[p];
    if (device.bytes_limit <= 0) device.bytes_limit = telemetry_->MemoryTotalOf(p);
    if (device.bytes_limit <= 0) device.bytes_limit = ShareOf(host, num_physical(), p);
  }
}

void VirtualClient::ShareMemoryAmongVirtualDevices() {
  // Virtual devices homed on one physical device split its memory, so a framework that sizes
  // its caches from every device's limit never plans for more memory than there is.
  std::vector<int> homed(physical_.size(), 0);
  for (const auto& device : devices_) ++homed[device->home_physical()];
  std::vector<int> rank(physical_.size(), 0);
  for (const auto& device : devices_) {
    const int home = device->home_physical();
    device->bytes_limit_ = ShareOf(physical_[home].bytes_limit, homed[home], rank[home]++);
  }
}

int VirtualClient::KindIndexOf(PJRT_Memory* physical_memory) const {
  auto it = kind_index_of_memory_.find(physical_memory);
  return it == kind_index_of_memory_.end() ? -1 : it->second;
}

StatusOr<VirtualBuffer*> VirtualClient::BufferFromHostBuffer(
    PJRT_Client_BufferFromHostBuffer_Args* args, VirtualMemory* memory) {
  const int physical_device = memory->device()->home_physical();
  PJRT_Memory* target = PhysicalMemory(physical_device, memory->kind_index());
  FLEXNPU_ASSIGN_OR_RETURN(HostTransfer transfer,
                           backend_->BufferFromHostBuffer(inner_.get(), *args, target));
  InnerEvent done = std::move(transfer.done_with_host_buffer);
  auto buffer = VirtualBuffer::Wrap(memory, std::move(transfer.buffer), physical_device);
  if (!buffer.ok()) {
    // The caller frees its host data once this fails: the inner transfer must be done with it.
    if (done) (void)backend_->Await(done.get());
    return buffer.status();
  }
  args->done_with_host_buffer =
      done ? ToHandle<PJRT_Event>(Event::Wrap(*backend_, done.release())) : nullptr;
  return buffer;
}

StatusOr<VirtualBuffer*> VirtualClient::CopyBuffer(VirtualBuffer* source,
                                                   VirtualMemory* destination) {
  const int physical_device = destination->device()->home_physical();
  PJRT_Memory* target = PhysicalMemory(physical_device, destination->kind_index());
  std::shared_ptr<PhysicalBuffer> physical = source->physical();
  FLEXNPU_ASSIGN_OR_RETURN(InnerBuffer copy,
                           backend_->CopyToMemory(physical->handle.get(), target));
  return VirtualBuffer::Wrap(destination, std::move(copy), physical_device);
}

Status VirtualClient::DefaultDeviceAssignment(int num_replicas, int num_partitions,
                                              int* out) const {
  const int64_t n = static_cast<int64_t>(num_replicas) * num_partitions;
  if (num_replicas <= 0 || num_partitions <= 0 || n > num_devices()) {
    return InvalidArgument("no default device assignment for " + std::to_string(num_replicas) +
                           " replicas x " + std::to_string(num_partitions) + " partitions over " +
                           std::to_string(num_devices()) + " virtual devices");
  }
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int>(i);
  return Status::Ok();
}

StatusOr<VirtualLoadedExecutable*> VirtualClient::Compile(const PJRT_Program* program,
                                                          std::string_view compile_options) {
  counters_.compiles.fetch_add(1, std::memory_order_relaxed);
  return VirtualLoadedExecutable::Compile(this, program, compile_options);
}

std::string VirtualClient::StatsJson() const {
  std::ostringstream out;
  out << "{\"platform_version\":\"" << platform_version_ << "\",\"policy\":\""
      << placer_->policy() << "\",\"roofline\":\"" << roofline_.name
      << "\",\"num_physical_devices\":" << num_physical() << ",\"physical_memory_bytes\":[";
  for (int p = 0; p < num_physical(); ++p) out << (p > 0 ? "," : "") << physical_[p].bytes_limit;
  out << "]"
      << ",\"executions\":" << counters_.executions.Load()
      << ",\"migrations\":" << counters_.migrations.load()
      << ",\"bytes_migrated\":" << counters_.bytes_migrated.load()
      << ",\"compiles\":" << counters_.compiles.load()
      << ",\"backend_compiles\":" << counters_.backend_compiles.load()
      << ",\"backend_loads\":" << counters_.backend_loads.load()
      << ",\"shared_loads\":" << counters_.shared_loads.load() << ",\"virtual_devices\":[";
  for (int v = 0; v < num_devices(); ++v) {
    VirtualDevice* d = devices_[v].get();
    if (v > 0) out << ",";
    out << "{\"id\":" << v << ",\"home_physical\":" << d->home_physical()
        << ",\"bytes_limit\":" << d->bytes_limit()
        << ",\"bytes_in_use\":" << d->stats().bytes_in_use()
        << ",\"peak_bytes_in_use\":" << d->stats().peak_bytes_in_use()
        << ",\"num_allocs\":" << d->stats().num_allocs() << "}";
  }
  out << "],\"modelled_device_time\":";
  // Devices whose time the backend models (emulate:PRESET): per physical device, the device
  // time of the executions it ran or queued (wall-clock time / time_scale).
  for (int p = 0; p < num_physical(); ++p) {
    auto modelled = backend_->ModelledTime(physical_[p].device);
    if (!modelled.ok()) {
      out << "null";
      break;
    }
    out << (p == 0 ? "[" : ",") << "{\"physical\":" << p << ",\"busy_s\":" << JsonNumber(modelled->busy_s)
        << ",\"executions\":" << modelled->executions
        << ",\"time_scale\":" << JsonNumber(modelled->time_scale)
        << ",\"co_run\":" << (modelled->co_run ? "true" : "false") << "}";
    if (p + 1 == num_physical()) out << "]";
  }
  out << ",\"placement\":" << placer_->SnapshotJson() << ",\"telemetry\":" << telemetry_->Json()
      << "}";
  return out.str();
}

}  // namespace flexnpu
