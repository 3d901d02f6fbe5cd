#include "pjrt_flexnpu/runtime/executable.h"

#include "pjrt_flexnpu/backend/compile_options.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable_serialization.h"
#include "pjrt_flexnpu/runtime/profile.h"

namespace flexnpu {
namespace {

std::atomic<uint64_t> next_executable_id{1};

}  // namespace

StatusOr<VirtualExecutable*> VirtualExecutable::Wrap(const PhysicalBackend& b,
                                                   PJRT_Executable* inner) {
  std::unique_ptr<VirtualExecutable> exe(new VirtualExecutable(b, inner));
  auto replicas = b.NumReplicas(inner);
  if (!replicas.ok()) return replicas.status();
  exe->num_replicas_ = *replicas;
  auto partitions = b.NumPartitions(inner);
  if (!partitions.ok()) return partitions.status();
  exe->num_partitions_ = *partitions;
  auto outputs = b.NumOutputs(inner);
  if (!outputs.ok()) return outputs.status();
  exe->num_outputs_ = *outputs;
  return exe.release();
}

StatusOr<VirtualLoadedExecutable*> VirtualLoadedExecutable::Compile(
    VirtualClient* client, const PJRT_Program* program, std::string_view compile_options,
    std::shared_ptr<const PrebuiltVariants> prebuilt) {
  auto info = ReadCompileOptions(compile_options);
  if (!info.ok()) return info.status();
  const int64_t n = info->num_replicas * info->num_partitions;
  std::vector<int64_t> ids = info->device_ids;
  if (!info->has_device_assignment) {
    if (n > client->num_devices()) {
      return InvalidArgument("a program over " + std::to_string(n) + " devices needs as many " +
                             "virtual devices; this client has " +
                             std::to_string(client->num_devices()));
    }
    for (int64_t i = 0; i < n; ++i) ids.push_back(i);
  }

  std::unique_ptr<VirtualLoadedExecutable> exe(new VirtualLoadedExecutable(client));
  std::vector<bool> seen(client->num_devices(), false);
  for (int64_t id : ids) {
    VirtualDevice* device = client->device(id);
    if (device == nullptr) {
      return InvalidArgument("compile options assign virtual device id " + std::to_string(id) +
                             "; this FlexNPU client has devices 0.." +
                             std::to_string(client->num_devices() - 1));
    }
    if (seen[id]) {
      return InvalidArgument("compile options assign virtual device id " + std::to_string(id) +
                             " twice");
    }
    seen[id] = true;
    exe->devices_.push_back(device);
    exe->device_handles_.push_back(ToHandle<PJRT_Device>(device));
  }
  exe->serialized_assignment_ =
      SerializeDeviceAssignment(info->num_replicas, info->num_partitions, ids);
  exe->single_device_ = n == 1;
  exe->original_options_.assign(compile_options);

  const std::string& mode = client->options().single_device_compile;
  const bool portable = exe->single_device_ && mode == "portable";
  const bool portable_fallback =
      exe->single_device_ && mode == "auto" && !client->placer().passthrough();
  exe->executable_id_ = next_executable_id.fetch_add(1, std::memory_order_relaxed);
  FLEXNPU_RETURN_IF_ERROR(exe->variants_.Configure(program, compile_options, portable,
                                                   portable_fallback, prebuilt));
  std::vector<int> mapping;
  if (!portable) {
    std::vector<int> virtual_ids(ids.begin(), ids.end());
    auto placed = exe->single_device_
                      ? StatusOr<std::vector<int>>(
                            std::vector<int>{client->placer().HomeOf(virtual_ids[0])})
                      : client->placer().PlaceGroup(virtual_ids);
    if (!placed.ok()) return placed.status();
    mapping = std::move(*placed);
  }
  FLEXNPU_RETURN_IF_ERROR(exe->variants_.CompileInitial(mapping));

  const PhysicalBackend& b = client->backend();
  auto got = b.GetExecutable(exe->variants_.initial()->executable.get());
  if (!got.ok()) return got.status();
  InnerExecutable unloaded = std::move(*got);
  auto num_outputs = b.NumOutputs(unloaded.get());
  if (!num_outputs.ok()) return num_outputs.status();
  exe->outputs_.set_count(*num_outputs);
  if (auto memory = b.CompiledMemoryStats(unloaded.get()); memory.ok()) {
    exe->may_donate_ = memory->alias_bytes > 0;
  }
  if (prebuilt != nullptr && prebuilt->has_profile) {
    exe->profile_ = prebuilt->profile;  // analysed when it was first compiled
    return exe.release();
  }
  // A program the analysis cannot read still runs: the placer then sees small, costless work.
  auto profile = ProfileExecutable(b, unloaded.get(), client->roofline(), &exe->donatable_);
  if (profile.ok()) exe->profile_ = *profile;
  // An aliased argument of no bytes (an empty array) is donated all the same, and IsDeleted
  // learns of donations only from NoteDonations.
  if (exe->donatable_.known && !exe->donatable_.arguments.empty()) exe->may_donate_ = true;
  return exe.release();
}

VirtualLoadedExecutable::~VirtualLoadedExecutable() {
  // NotFound when it never ran under a learning policy: nothing to forget then.
  if (executable_id_ != 0) (void)client_->placer().core()->ForgetExecutable(executable_id_);
}

Status VirtualLoadedExecutable::Delete() {
  deleted_.store(true, std::memory_order_release);
  return variants_.DeleteAll();
}

}  // namespace flexnpu
