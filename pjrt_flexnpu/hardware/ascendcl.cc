// Ascend NPUs through AscendCL (libascendcl.so), utilisation optionally through DCMI.
#include <algorithm>
#include <mutex>
#include <utility>

#include "pjrt_flexnpu/hardware/hardware.h"
#include "pjrt_flexnpu/hardware/library.h"
#include "pjrt_flexnpu/hardware/vendor_api.h"

namespace flexnpu::hardware {
namespace {

struct AclApi {
  decltype(&::aclInit) init = nullptr;
  decltype(&::aclFinalize) finalize = nullptr;
  decltype(&::aclrtGetDeviceCount) get_device_count = nullptr;
  decltype(&::aclrtSetDevice) set_device = nullptr;
  decltype(&::aclrtResetDevice) reset_device = nullptr;
  decltype(&::aclrtGetSocName) get_soc_name = nullptr;
  decltype(&::aclrtGetMemInfo) get_mem_info = nullptr;
  decltype(&::aclGetRecentErrMsg) get_recent_err_msg = nullptr;
  // Optional: absent from older CANN releases.
  decltype(&::aclrtGetDeviceInfo) get_device_info = nullptr;
  decltype(&::aclrtGetDeviceUtilizationRate) get_utilization = nullptr;
};

struct DcmiApi {
  decltype(&::dcmi_get_card_id_device_id_from_logicid) card_of_logic_id = nullptr;
  decltype(&::dcmi_get_device_utilization_rate) utilization = nullptr;
};

std::vector<std::string> AclCandidates(const SourceOptions& options) {
  if (!options.ascendcl_library.empty()) return {options.ascendcl_library};
  std::vector<std::string> out;
  for (const char* var : {"ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"}) {
    if (auto home = options.env(var); home && !home->empty()) {
      out.push_back(*home + "/lib64/libascendcl.so");
    }
  }
  out.push_back("libascendcl.so");
  return out;
}

class AscendClSource final : public TelemetrySource {
 public:
  AscendClSource(Library library, AclApi api, std::vector<int> physical_ids)
      : library_(std::move(library)), api_(api), physical_ids_(std::move(physical_ids)) {}

  ~AscendClSource() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < bound_.size(); ++i) {
      if (bound_[i]) (void)api_.reset_device(static_cast<int32_t>(i));
    }
    if (initialised_) (void)api_.finalize();
  }

  // aclInit, the device count and the visible-device map; the caller checked the symbols.
  Status Init(std::string config_path) {
    const char* config = config_path.empty() ? nullptr : config_path.c_str();
    FLEXNPU_RETURN_IF_ERROR(Check(api_.init(config), "aclInit"));
    initialised_ = true;
    uint32_t count = 0;
    FLEXNPU_RETURN_IF_ERROR(Check(api_.get_device_count(&count), "aclrtGetDeviceCount"));
    count_ = static_cast<int>(count);
    bound_.assign(count_, false);
    if (physical_ids_.empty()) {
      for (int i = 0; i < count_; ++i) physical_ids_.push_back(i);
    }
    physical_ids_.resize(count_, -1);  // more logical devices than the list names: unknown
    const char* soc = api_.get_soc_name();
    soc_name_ = soc != nullptr ? soc : "";
    return Status::Ok();
  }
  bool initialised() const { return initialised_; }

  void SetDcmi(Library library, DcmiApi api) {
    dcmi_library_ = std::move(library);
    dcmi_ = api;
  }
  void AddNote(std::string note) { notes_.push_back(std::move(note)); }

  SourceKind kind() const override { return SourceKind::kAscendCl; }
  std::string library() const override { return library_.description(); }
  int device_count() const override { return count_; }
  std::vector<std::string> notes() const override { return notes_; }

  StatusOr<DeviceInfo> Describe(int index) override {
    FLEXNPU_RETURN_IF_ERROR(CheckIndex(index));
    DeviceInfo info;
    info.index = index;
    info.physical_index = physical_ids_[index];
    info.source = SourceKind::kAscendCl;
    info.name = soc_name_;
    info.preset = PresetForName(soc_name_);
    if (api_.get_device_info != nullptr) {
      int64_t cores = 0;
      if (api_.get_device_info(static_cast<uint32_t>(index), ACL_DEV_ATTR_AICORE_CORE_NUM,
                               &cores) == ACL_SUCCESS) {
        info.ai_cores = cores;
      }
    }
    auto sample = Read(index);
    if (!sample.ok()) return sample.status();
    info.sample = *sample;
    return info;
  }

  StatusOr<Sample> Read(int index) override {
    FLEXNPU_RETURN_IF_ERROR(CheckIndex(index));
    Sample sample;
    sample.index = index;
    // aclrtGetMemInfo reports the calling thread's current device: make it `index` for the
    // call and undo that again. The runtime reference-counts SetDevice/ResetDevice, so a
    // device bound by Bind (or by the PJRT plugin) stays open across the pair.
    FLEXNPU_RETURN_IF_ERROR(Check(api_.set_device(index), "aclrtSetDevice", index));
    size_t free = 0;
    size_t total = 0;
    const aclError mem = api_.get_mem_info(ACL_HBM_MEM, &free, &total);
    Status mem_status = Check(mem, "aclrtGetMemInfo(ACL_HBM_MEM)", index);
    (void)api_.reset_device(index);
    FLEXNPU_RETURN_IF_ERROR(mem_status);
    sample.memory_free_bytes = static_cast<int64_t>(free);
    sample.memory_total_bytes = static_cast<int64_t>(total);
    if (sample.memory_total_bytes == 0 && api_.get_device_info != nullptr) {
      int64_t total_attr = 0;
      if (api_.get_device_info(static_cast<uint32_t>(index), ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE,
                               &total_attr) == ACL_SUCCESS) {
        sample.memory_total_bytes = total_attr;
      }
    }
    if (api_.get_utilization != nullptr) {
      aclrtUtilizationInfo u{};
      u.utilizationExtend = nullptr;
      FLEXNPU_RETURN_IF_ERROR(Check(api_.get_utilization(index, &u),
                                    "aclrtGetDeviceUtilizationRate", index));
      sample.utilization.cube = Percent(u.cubeUtilization);
      sample.utilization.vector = Percent(u.vectorUtilization);
      sample.utilization.memory = Percent(u.memoryUtilization);
      sample.utilization.compute = std::max(sample.utilization.cube, sample.utilization.vector);
    }
    if (sample.utilization.compute == kUnsupported && dcmi_.utilization != nullptr &&
        physical_ids_[index] >= 0) {
      int card = 0;
      int device = 0;
      unsigned int rate = 0;
      if (dcmi_.card_of_logic_id(&card, &device,
                                 static_cast<unsigned int>(physical_ids_[index])) == 0 &&
          dcmi_.utilization(card, device, DCMI_UTILIZATION_AICORE, &rate) == 0 && rate <= 100) {
        sample.utilization.compute = static_cast<int>(rate);
      }
    }
    return sample;
  }

  Status Bind(int index) override {
    FLEXNPU_RETURN_IF_ERROR(CheckIndex(index));
    std::lock_guard<std::mutex> lock(mu_);
    if (bound_[index]) return Status::Ok();
    FLEXNPU_RETURN_IF_ERROR(Check(api_.set_device(index), "aclrtSetDevice", index));
    bound_[index] = true;
    return Status::Ok();
  }

  Status Unbind(int index) override {
    FLEXNPU_RETURN_IF_ERROR(CheckIndex(index));
    std::lock_guard<std::mutex> lock(mu_);
    if (!bound_[index]) return Status::Ok();
    bound_[index] = false;
    return Check(api_.reset_device(index), "aclrtResetDevice", index);
  }

  bool bound(int index) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return index >= 0 && index < count_ && bound_[index];
  }

  // "AscendCL (libascendcl.so at P): aclrtSetDevice(3) failed with ACL error 107001: <msg>"
  Status Check(aclError code, const char* call, int device = -1) const {
    if (code == ACL_SUCCESS) return Status::Ok();
    std::string message = "AscendCL (" + library_.description() + "): " + call;
    if (device >= 0 && std::string(call).find('(') == std::string::npos) {
      message += "(" + std::to_string(device) + ")";
    } else if (device >= 0) {
      message += " on device " + std::to_string(device);
    }
    message += " failed with ACL error " + std::to_string(code);
    const char* text = api_.get_recent_err_msg != nullptr ? api_.get_recent_err_msg() : nullptr;
    if (text != nullptr && text[0] != '\0') message += ": " + std::string(text);
    // 1xxxxx: parameter errors; 2xxxxx: resources; 5xxxxx: internal (CANN's classes).
    const Code status_code = code / 100000 == 1   ? Code::kInvalidArgument
                             : code / 100000 == 2 ? Code::kResourceExhausted
                                                  : Code::kInternal;
    return Status(status_code, message);
  }

 private:
  static int Percent(int32_t value) { return value < 0 || value > 100 ? kUnsupported : value; }

  Status CheckIndex(int index) const {
    if (index < 0 || index >= count_) {
      return InvalidArgument("AscendCL device " + std::to_string(index) + " out of range [0, " +
                             std::to_string(count_) + ")");
    }
    return Status::Ok();
  }

  Library library_;
  AclApi api_;
  Library dcmi_library_;
  DcmiApi dcmi_;
  std::vector<int> physical_ids_;
  bool initialised_ = false;
  int count_ = 0;
  std::string soc_name_;
  std::vector<std::string> notes_;
  mutable std::mutex mu_;
  std::vector<bool> bound_;
};

}  // namespace

StatusOr<std::unique_ptr<TelemetrySource>> OpenAscendCl(const SourceOptions& options) {
  std::vector<int> physical_ids;
  if (auto visible = options.env("ASCEND_RT_VISIBLE_DEVICES")) {
    auto parsed = ParseVisibleDevices(*visible);
    if (!parsed.ok()) return parsed.status();
    physical_ids = std::move(*parsed);
  }
  auto library = Library::Open("libascendcl.so", AclCandidates(options));
  if (!library.ok()) {
    return Status(library.status().code(),
                  "AscendCL: " + library.status().message() +
                      " (set option ascendcl_library / FLEXNPU_ASCENDCL_LIBRARY or "
                      "ASCEND_HOME_PATH)");
  }
  AclApi api;
  std::string missing;
  const auto need = [&](const char* name, auto** slot) { library->Require(name, slot, &missing); };
  need("aclInit", &api.init);
  need("aclFinalize", &api.finalize);
  need("aclrtGetDeviceCount", &api.get_device_count);
  need("aclrtSetDevice", &api.set_device);
  need("aclrtResetDevice", &api.reset_device);
  need("aclrtGetSocName", &api.get_soc_name);
  need("aclrtGetMemInfo", &api.get_mem_info);
  need("aclGetRecentErrMsg", &api.get_recent_err_msg);
  if (!missing.empty()) {
    return FailedPrecondition("AscendCL (" + library->description() +
                              "): missing symbol(s) " + missing +
                              " (not a CANN runtime library, or too old)");
  }
  library->Bind("aclrtGetDeviceInfo", &api.get_device_info);
  library->Bind("aclrtGetDeviceUtilizationRate", &api.get_utilization);
  const std::string description = library->description();
  auto source = std::make_unique<AscendClSource>(std::move(*library), api, physical_ids);
  Status init = source->Init("");
  if (!init.ok()) return init;
  if (api.get_utilization == nullptr) {
    source->AddNote(description + " has no aclrtGetDeviceUtilizationRate: utilisation from DCMI "
                    "if it loads, else unsupported");
  }
  // DCMI: utilisation where ACL has none (older CANN, or -1 from the runtime).
  const std::string dcmi_path = options.dcmi_library.empty() ? "libdcmi.so" : options.dcmi_library;
  auto dcmi = Library::Open("libdcmi.so", {dcmi_path});
  if (dcmi.ok()) {
    DcmiApi dcmi_api;
    decltype(&::dcmi_init) dcmi_init = nullptr;
    if (dcmi->Bind("dcmi_init", &dcmi_init) &&
        dcmi->Bind("dcmi_get_card_id_device_id_from_logicid", &dcmi_api.card_of_logic_id) &&
        dcmi->Bind("dcmi_get_device_utilization_rate", &dcmi_api.utilization) &&
        dcmi_init() == 0) {
      source->SetDcmi(std::move(*dcmi), dcmi_api);
    } else {
      source->AddNote(dcmi->description() + " is unusable (symbols or dcmi_init): not used");
    }
  }
  return std::unique_ptr<TelemetrySource>(std::move(source));
}

}  // namespace flexnpu::hardware
