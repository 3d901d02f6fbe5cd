// Policy names and the policy-string parser.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Lower case, '_' -> '-'.
std::string Normalize(std::string_view s) {
  std::string out(Trim(s));
  for (char& c : out) {
    c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

bool ParseInt(std::string_view s, int* out) {
  s = Trim(s);
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string JoinPool(const std::vector<int>& pool) {
  std::string out;
  for (size_t i = 0; i < pool.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(pool[i]);
  }
  return out;
}

}  // namespace

const char* ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kPassthrough: return "passthrough";
    case Reason::kAffinity: return "affinity";
    case Reason::kLeastLoaded: return "least_loaded";
    case Reason::kPool: return "pool";
    case Reason::kIdleSteal: return "idle_steal";
    case Reason::kReturnHome: return "return_home";
    case Reason::kAvoidFailed: return "avoid_failed";
    case Reason::kFallback: return "fallback";
  }
  return "?";
}

const char* PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kPassthrough: return "passthrough";
    case PolicyKind::kStaticPd: return "static-pd";
    case PolicyKind::kStaticColocate: return "static-colocate";
    case PolicyKind::kDynamic: return "dynamic";
  }
  return "?";
}

std::string PolicySpec::ToString() const {
  std::string out = PolicyKindName(kind);
  if (kind == PolicyKind::kStaticPd) {
    out += ":prefill=" + JoinPool(prefill_pool) + ";decode=" + JoinPool(decode_pool);
  }
  return out;
}

StatusOr<std::vector<int>> ParsePool(std::string_view list, int num_physical,
                                     std::string_view what) {
  std::vector<int> pool;
  std::string_view rest = Trim(list);
  if (rest.empty()) return InvalidArgument(std::string(what) + " is empty: list devices, e.g. 0,1");
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = Trim(rest.substr(0, comma));
    int lo = 0, hi = 0;
    const size_t dash = item.find('-');
    const bool ok = dash == std::string_view::npos
                        ? ParseInt(item, &lo) && ParseInt(item, &hi)
                        : ParseInt(item.substr(0, dash), &lo) && ParseInt(item.substr(dash + 1), &hi);
    if (!ok) {
      return InvalidArgument(std::string(what) + ": " + Quote(item) +
                             " is not a device number or range (e.g. 2 or 0-3)");
    }
    if (lo > hi) {
      return InvalidArgument(std::string(what) + ": range " + Quote(item) + " is backwards");
    }
    if (hi >= num_physical) {
      return InvalidArgument(std::string(what) + ": device " + std::to_string(hi) +
                             " does not exist (physical devices 0-" +
                             std::to_string(num_physical - 1) + ")");
    }
    for (int d = lo; d <= hi; ++d) {
      if (std::find(pool.begin(), pool.end(), d) != pool.end()) {
        return InvalidArgument(std::string(what) + ": device " + std::to_string(d) +
                               " is listed twice");
      }
      pool.push_back(d);
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return pool;
}

Status ValidatePolicy(const PolicySpec& spec, int num_physical) {
  if (num_physical <= 0) return FailedPrecondition("placement needs at least one physical device");
  if (spec.kind != PolicyKind::kStaticPd) {
    if (!spec.prefill_pool.empty() || !spec.decode_pool.empty()) {
      return InvalidArgument(std::string("policy '") + PolicyKindName(spec.kind) +
                             "' takes no pools (only static-pd does)");
    }
    return Status::Ok();
  }
  if (spec.prefill_pool.empty()) return InvalidArgument("static-pd: the prefill pool is missing");
  if (spec.decode_pool.empty()) return InvalidArgument("static-pd: the decode pool is missing");
  std::vector<char> seen(num_physical, 0);
  for (int pass = 0; pass < 2; ++pass) {
    const auto& pool = pass == 0 ? spec.prefill_pool : spec.decode_pool;
    const char* name = pass == 0 ? "prefill" : "decode";
    for (int d : pool) {
      if (d < 0 || d >= num_physical) {
        return InvalidArgument(std::string("static-pd: ") + name + " device " +
                               std::to_string(d) + " does not exist (physical devices 0-" +
                               std::to_string(num_physical - 1) + ")");
      }
      if (seen[d] & (1 << pass)) {
        return InvalidArgument(std::string("static-pd: ") + name + " device " +
                               std::to_string(d) + " is listed twice");
      }
      if (seen[d]) {
        return InvalidArgument("static-pd: device " + std::to_string(d) +
                               " is in both the prefill and the decode pool");
      }
      seen[d] |= static_cast<char>(1 << pass);
    }
  }
  return Status::Ok();
}

StatusOr<PolicySpec> ParsePolicy(std::string_view text, int num_physical) {
  if (num_physical <= 0) return FailedPrecondition("placement needs at least one physical device");
  const std::string_view trimmed = Trim(text);
  const size_t colon = trimmed.find(':');
  const std::string name = Normalize(trimmed.substr(0, colon));
  const std::string_view params =
      colon == std::string_view::npos ? std::string_view() : Trim(trimmed.substr(colon + 1));
  PolicySpec spec;
  if (name == "passthrough") {
    spec.kind = PolicyKind::kPassthrough;
  } else if (name == "static-pd") {
    spec.kind = PolicyKind::kStaticPd;
  } else if (name == "static-colocate") {
    spec.kind = PolicyKind::kStaticColocate;
  } else if (name == "dynamic") {
    spec.kind = PolicyKind::kDynamic;
  } else {
    return InvalidArgument("unknown placement policy " + Quote(name) +
                           " (known: passthrough, static-pd, static-colocate, dynamic)");
  }
  if (spec.kind != PolicyKind::kStaticPd) {
    if (colon != std::string_view::npos) {
      return InvalidArgument("policy " + Quote(name) + " takes no parameters, got " +
                             Quote(params));
    }
    return spec;
  }
  if (params.empty()) {
    return InvalidArgument(
        "static-pd needs its pools, e.g. 'static-pd:prefill=0,1;decode=2,3'");
  }
  bool have_prefill = false, have_decode = false;
  std::string_view rest = params;
  while (!rest.empty()) {
    const size_t sep = rest.find_first_of(";| \t");
    const std::string_view item = Trim(rest.substr(0, sep));
    rest = sep == std::string_view::npos ? std::string_view() : rest.substr(sep + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgument("static-pd: " + Quote(item) +
                             " is not key=devices (keys: prefill, decode)");
    }
    const std::string key = Normalize(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    std::vector<int>* pool = nullptr;
    bool* have = nullptr;
    if (key == "prefill") {
      pool = &spec.prefill_pool;
      have = &have_prefill;
    } else if (key == "decode") {
      pool = &spec.decode_pool;
      have = &have_decode;
    } else {
      return InvalidArgument("static-pd: unknown pool " + Quote(key) +
                             " (keys: prefill, decode)");
    }
    if (*have) return InvalidArgument("static-pd: the " + key + " pool is given twice");
    *have = true;
    auto parsed = ParsePool(value, num_physical, "static-pd " + key + " pool");
    if (!parsed.ok()) return parsed.status();
    *pool = std::move(*parsed);
  }
  FLEXNPU_RETURN_IF_ERROR(ValidatePolicy(spec, num_physical));
  return spec;
}

}  // namespace flexnpu::placement
