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
  if (prebuilt_ != nullptr) {  // deserialized: load the variant when the envelope has it
    auto found = LoadPrebuiltVariant(*prebuilt_, *client_, physical, options);
    if (!found.ok()) return found.status();
    loaded = std::move(*found);
    if (loaded != nullptr) {
      client_->counters().backend_loads.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (loaded == nullptr) {
    auto compiled = b.Compile(client_->inner(), &program, options);
    if (!compiled.ok()) return compiled.status();
    loaded = std::move(*compiled);
    client_->counters().backend_compiles.fetch_add(1, std::memory_order_relaxed);
  }

  auto compiled = std::make_shared<CompiledVariant>();
  compiled->executable = std::move(loaded);
  compiled->physical = physical;
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
