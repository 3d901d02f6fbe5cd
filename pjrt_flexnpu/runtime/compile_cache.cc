#include "pjrt_flexnpu/runtime/compile_cache.h"

#include <chrono>

#include "pjrt_flexnpu/backend/compile_options.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable_serialization.h"

namespace flexnpu {

Status CompileCache::Configure(const PJRT_Program* program, std::string_view compile_options,
                               bool portable, bool portable_fallback,
                               std::shared_ptr<const PrebuiltVariants> prebuilt) {
  program_code_.assign(program->code, program->code_size);
  program_format_.assign(program->format, program->format_size);
  prebuilt_ = std::move(prebuilt);
  portable_ = portable;
  portable_fallback_ = portable_fallback;
  if (portable_) {
    auto rewritten = RewriteAsPortable(compile_options);
    if (!rewritten.ok()) return rewritten.status();
    compile_options_ = std::move(*rewritten);
    return Status::Ok();
  }
  compile_options_.assign(compile_options);
  if (portable_fallback_) {
    auto rewritten = RewriteAsPortable(compile_options);
    if (!rewritten.ok()) return rewritten.status();
    portable_options_ = std::move(*rewritten);
  }
  return Status::Ok();
}

Status CompileCache::CompileInitial(const std::vector<int>& mapping) {
  auto compiled = CompileFor(mapping);
  if (!compiled.ok()) return compiled.status();
  initial_ = *compiled;
  return Status::Ok();
}

CompileCache::CompiledResult CompileCache::CompileFor(const std::vector<int>& physical) {
  const PhysicalBackend& b = client_->backend();
  // An empty mapping is the portable compile.
  std::string options = portable_ || !physical.empty() ? compile_options_ : portable_options_;
  if (!physical.empty()) {
    std::vector<int64_t> physical_ids;
    for (int p : physical) physical_ids.push_back(client_->physical(p).id);
    auto rewritten = RewriteDeviceAssignment(compile_options_, physical_ids);
    if (!rewritten.ok()) return rewritten.status();
    options = std::move(*rewritten);
  }
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = program_code_.data();
  program.code_size = program_code_.size();
  program.format = program_format_.data();
  program.format_size = program_format_.size();
  InnerLoadedExecutable loaded;
  // Deserialized: load the variant when the envelope has it. These inner bytes come only from
  // an envelope whose checksum DeserializeAndLoadExecutable verified before parsing it, so they
  // are the bytes that were written. A corrupt cache entry never gets this far: it is refused
  // with INVALID_ARGUMENT, which JAX's persistent cache treats as a miss (a warning, then a
  // compile), what a user expects of a damaged cache file: the program compiled again, never
  // other bytes loaded. A failure of these intact bytes is returned, not hidden by a compile.
  // (SharedCompiles below holds bytes this process serialized itself, never read from disk.)
  if (prebuilt_ != nullptr) {
    auto found = LoadPrebuiltVariant(*prebuilt_, *client_, physical, options);
    if (!found.ok()) return found.status();
    loaded = std::move(*found);
    if (loaded != nullptr) {
      client_->counters().backend_loads.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::shared_ptr<const std::string> inner_bytes;
  if (loaded == nullptr) {
    FLEXNPU_ASSIGN_OR_RETURN(loaded, CompileOrShare(physical, program, options, &inner_bytes));
  }

  auto compiled = std::make_shared<CompiledVariant>();
  compiled->executable = std::move(loaded);
  compiled->physical = physical;
  compiled->inner_bytes = std::move(inner_bytes);
  if (physical.size() > 1) {
    FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Device*> devices,
                             b.AddressableDevices(compiled->executable.get()));
    for (int p : physical) {
      int position = -1;
      for (size_t i = 0; i < devices.size; ++i) {
        if (devices[i] == client_->physical(p).device) {
          position = static_cast<int>(i);
        }
      }
      if (position < 0) {
        return Internal("the physical backend compiled the SPMD program without physical device " +
                        std::to_string(p) + " that FlexNPU assigned");
      }
      compiled->inner_position.push_back(position);
    }
  }
  return compiled;
}

StatusOr<InnerLoadedExecutable> CompileCache::CompileOrShare(
    const std::vector<int>& physical, const PJRT_Program& program, const std::string& options,
    std::shared_ptr<const std::string>* inner_bytes) {
  const PhysicalBackend& b = client_->backend();
  SharedCompiles::Found found;
  // Portable compiles run anywhere already: one per executable, nothing to share. Options
  // whose key cannot be read are compiled as they are.
  auto options_key = client_->options().share_compiles && !physical.empty()
                         ? CompileOptionsKey(compile_options_)
                         : StatusOr<std::string>(FailedPrecondition("not shared"));
  if (options_key.ok()) {
    std::vector<std::string> kinds;
    for (int p : physical) kinds.push_back(client_->physical(p).kind);
    found = client_->shared_compiles().Find(
        SharedCompiles::KeyOf(program_format_, program_code_, *options_key, kinds));
  }
  if (found.bytes != nullptr) {
    // A backend that cannot load it onto these devices compiles it instead.
    auto shared = b.DeserializeAndLoad(client_->inner(), *found.bytes, options);
    if (shared.ok() && RunsOnExactly(*client_, shared->get(), physical)) {
      client_->counters().shared_loads.fetch_add(1, std::memory_order_relaxed);
      *inner_bytes = std::move(found.bytes);
      return std::move(*shared);
    }
  }
  FLEXNPU_ASSIGN_OR_RETURN(InnerLoadedExecutable loaded,
                           b.Compile(client_->inner(), &program, options));
  client_->counters().backend_compiles.fetch_add(1, std::memory_order_relaxed);
  if (found.claim != nullptr) {
    // A program the backend cannot serialize (host callbacks, ...) is compiled per device.
    auto unloaded = b.GetExecutable(loaded.get());
    auto bytes = unloaded.ok() ? b.Serialize(unloaded->get())
                               : StatusOr<std::string>(unloaded.status());
    if (bytes.ok()) {
      *inner_bytes = std::make_shared<const std::string>(std::move(*bytes));
      found.claim->Publish(*inner_bytes);
    }
  }
  return loaded;
}

bool RunsOnExactly(const VirtualClient& client, PJRT_LoadedExecutable* loaded,
                   const std::vector<int>& physical) {
  auto devices = client.backend().AddressableDevices(loaded);
  if (!devices.ok() || devices->size != physical.size()) return false;
  for (int p : physical) {
    bool found = false;
    for (PJRT_Device* device : *devices) found = found || device == client.physical(p).device;
    if (!found) return false;
  }
  return true;
}

std::string SharedCompiles::KeyOf(std::string_view program_format, std::string_view program_code,
                                  std::string_view options_without_assignment,
                                  const std::vector<std::string>& kinds) {
  std::string key;
  auto add = [&key](std::string_view part) {
    key += std::to_string(part.size());
    key += ':';
    key += part;
  };
  add(program_format);
  add(program_code);
  add(options_without_assignment);
  for (const std::string& kind : kinds) add(kind);
  return key;
}

SharedCompiles::Found SharedCompiles::Find(std::string key) {
  std::shared_future<Bytes> earlier;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      auto claim = std::make_unique<Claim>(this, key);
      entries_.emplace(std::move(key), Entry{claim->promise_.get_future().share(), ++next_order_});
      return Found{nullptr, std::move(claim)};
    }
    earlier = it->second.bytes;
  }
  return Found{earlier.get(), nullptr};  // outside mu_: other keys' compiles go on
}

void SharedCompiles::Claim::Publish(Bytes bytes) {
  if (owner_ == nullptr) return;
  owner_->Resolve(key_, promise_, bytes);
  owner_ = nullptr;
}

void SharedCompiles::Resolve(const std::string& key, std::promise<Bytes>& promise,
                             const Bytes& bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (bytes == nullptr) {
      entries_.erase(it);  // not shareable: later compiles of it try again
    } else {
      it->second.size = bytes->size();
      total_bytes_ += bytes->size();
      while (total_bytes_ > kMaxBytes) {
        // The oldest published entry (those in progress have no size yet).
        auto oldest = entries_.end();
        for (auto e = entries_.begin(); e != entries_.end(); ++e) {
          if (e->second.size > 0 && (oldest == entries_.end() ||
                                     e->second.order < oldest->second.order)) {
            oldest = e;
          }
        }
        total_bytes_ -= oldest->second.size;
        entries_.erase(oldest);
      }
    }
  }
  promise.set_value(bytes);
}

CompileCache::CompiledResult CompileCache::For(const int* physical, size_t n) {
  if (!portable_ && n == initial_->physical.size() &&
      std::equal(physical, physical + n, initial_->physical.begin())) {
    return initial_;
  }
  if (n == 1) {
    std::lock_guard<std::mutex> lock(recent_mu_);
    if (recent_ != nullptr && recent_device_ == physical[0]) {
      recent_->last_use.store(++use_clock_, std::memory_order_relaxed);
      return recent_;
    }
  }
  std::promise<CompiledResult> promise;
  std::shared_future<CompiledResult> future;
  bool compile_here = false;
  const std::vector<int>* key = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_mapping_.find(MappingKey{physical, n});
    if (it != by_mapping_.end()) {
      it->second.last_use = ++use_clock_;
      future = it->second.compiled;
    } else {
      future = promise.get_future().share();
      it = by_mapping_.emplace(std::vector<int>(physical, physical + n),
                               CacheEntry{future, ++use_clock_}).first;
      key = &it->first;  // stays valid: compiles in progress are never evicted
      EvictLocked();
      compile_here = true;
    }
  }
  if (!compile_here) {
    CompiledResult found = future.get();
    if (found.ok() && n == 1) Remember(physical[0], *found);
    return found;
  }
  {
    // Outside mu_: executions of mappings already compiled go on meanwhile; those wanting this
    // one wait on the future.
    const std::vector<int> mapping = *key;
    CompiledResult compiled = CompileFor(mapping);
    if (!compiled.ok()) {
      // Failures are not cached: a later execution may try again.
      std::lock_guard<std::mutex> lock(mu_);
      by_mapping_.erase(mapping);
    }
    if (compiled.ok() && n == 1) Remember(physical[0], *compiled);
    promise.set_value(std::move(compiled));
  }
  return future.get();
}

void CompileCache::Remember(int physical_device, const std::shared_ptr<CompiledVariant>& compiled) {
  compiled->last_use.store(++use_clock_, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(recent_mu_);
  recent_device_ = physical_device;
  recent_ = compiled;
}

void CompileCache::RememberFallback(int physical_device,
                                    const std::shared_ptr<CompiledVariant>& portable) {
  {
    std::promise<CompiledResult> ready;
    ready.set_value(portable);
    std::lock_guard<std::mutex> lock(mu_);
    // Another execution may have filled the entry meanwhile (a retry that compiled): keep it.
    by_mapping_.emplace(std::vector<int>{physical_device},
                        CacheEntry{ready.get_future().share(), ++use_clock_});
    EvictLocked();
  }
  Remember(physical_device, portable);
}

uint64_t CompileCache::LastUse(const CacheEntry& entry) {
  const CompiledResult& result = entry.compiled.get();  // ready: only those are evicted
  if (!result.ok()) return entry.last_use;
  return std::max(entry.last_use, (*result)->last_use.load(std::memory_order_relaxed));
}

void CompileCache::EvictLocked() {
  while (by_mapping_.size() > kMaxCachedMappings) {
    auto victim = by_mapping_.end();
    for (auto it = by_mapping_.begin(); it != by_mapping_.end(); ++it) {
      // Compiles in progress stay (their compiler thread erases or fills them).
      if (it->second.compiled.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        continue;
      }
      if (victim == by_mapping_.end() || LastUse(it->second) < LastUse(victim->second)) {
        victim = it;
      }
    }
    if (victim == by_mapping_.end()) return;
    by_mapping_.erase(victim);
  }
}

size_t CompileCache::num_cached_mappings() {
  std::lock_guard<std::mutex> lock(mu_);
  return by_mapping_.size() + (portable_ ? 0 : 1);
}

std::vector<std::shared_ptr<CompiledVariant>> CompileCache::Variants() {
  std::vector<std::shared_ptr<CompiledVariant>> compiled;
  if (initial_ != nullptr) compiled.push_back(initial_);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [mapping, entry] : by_mapping_) {
    if (entry.compiled.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
    const CompiledResult& result = entry.compiled.get();
    if (result.ok() && *result != initial_) compiled.push_back(*result);
  }
  return compiled;
}

Status CompileCache::DeleteAll() {
  std::vector<std::shared_ptr<CompiledVariant>> compiled{initial_};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [mapping, entry] : by_mapping_) {
      if (entry.compiled.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      const CompiledResult& result = entry.compiled.get();
      // A device's fallback entry holds the portable variant, which has its own entry too.
      if (result.ok() && *result != initial_ &&
          std::find(compiled.begin(), compiled.end(), *result) == compiled.end()) {
        compiled.push_back(*result);
      }
    }
  }
  {
    // Evicted from the map but still the recent variant: deleted too.
    std::lock_guard<std::mutex> lock(recent_mu_);
    if (recent_ != nullptr &&
        std::find(compiled.begin(), compiled.end(), recent_) == compiled.end()) {
      compiled.push_back(recent_);
    }
  }
  const PhysicalBackend& b = client_->backend();
  for (const auto& c : compiled) FLEXNPU_RETURN_IF_ERROR(b.Delete(c->executable.get()));
  return Status::Ok();
}

}  // namespace flexnpu
