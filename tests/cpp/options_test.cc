#include "pjrt_flexnpu/runtime/options.h"

#include <gtest/gtest.h>

#include <map>

namespace flexnpu {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(OptionsTest, DefaultsWithoutOptionsOrEnvironment) {
  auto options = ParseOptions({}, FakeEnv({}));
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->backend, "cpu");
  EXPECT_EQ(options->num_virtual_devices, 0);
  EXPECT_EQ(options->policy, "passthrough");
  EXPECT_TRUE(options->share_compiles);
  auto backend = EffectiveBackendOptions(*options);
  ASSERT_EQ(backend.size(), 1u);
  EXPECT_EQ(backend[0].name, "cpu_device_count");
  EXPECT_EQ(std::get<int64_t>(backend[0].value), kDefaultCpuDeviceCount);
}

TEST(OptionsTest, ExplicitOptionWinsOverEnvironment) {
  auto options = ParseOptions({{"num_virtual_devices", int64_t{3}}},
                              FakeEnv({{"FLEXNPU_NUM_VIRTUAL_DEVICES", "8"},
                                       {"FLEXNPU_BACKEND", "/x/plugin.so"}}));
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->num_virtual_devices, 3);
  EXPECT_EQ(options->backend, "/x/plugin.so");
  // Not the CPU plugin: no default device count is added.
  EXPECT_TRUE(EffectiveBackendOptions(*options).empty());
}

TEST(OptionsTest, EmulatedBackendGetsTheCpuPluginItCompilesWith) {
  auto options = ParseOptions({}, FakeEnv({{"FLEXNPU_BACKEND", "emulate:910c"},
                                           {"FLEXNPU_BACKEND_OPTIONS", "device_count=2"},
                                           {"FLEXNPU_CPU_PLUGIN_PATH", "/x/cpu.so"}}));
  ASSERT_TRUE(options.ok()) << options.status().message();
  auto backend = EffectiveBackendOptions(*options);
  ASSERT_EQ(backend.size(), 2u);
  EXPECT_EQ(backend[0].name, "device_count");
  EXPECT_EQ(backend[1].name, "cpu_plugin_path");
  EXPECT_EQ(std::get<std::string>(backend[1].value), "/x/cpu.so");
}

TEST(OptionsTest, CompileSharingCanBeTurnedOff) {
  auto off = ParseOptions({}, FakeEnv({{"FLEXNPU_SHARE_COMPILES", "0"}}));
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->share_compiles);
  auto on = ParseOptions({{"share_compiles", std::string("true")}},
                         FakeEnv({{"FLEXNPU_SHARE_COMPILES", "0"}}));
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->share_compiles);
}

TEST(OptionsTest, StringValuesFromJaxAreParsed) {
  auto options = ParseOptions({{"num_virtual_devices", std::string("6")}}, FakeEnv({}));
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->num_virtual_devices, 6);
}

TEST(OptionsTest, BackendOptionsAreTyped) {
  auto parsed = ParseBackendOptions("a=1; b = 2.5, c=true;d:false;e=hello;f=-7");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed->size(), 6u);
  EXPECT_EQ(std::get<int64_t>((*parsed)[0].value), 1);
  EXPECT_DOUBLE_EQ(std::get<double>((*parsed)[1].value), 2.5);
  EXPECT_TRUE(std::get<bool>((*parsed)[2].value));
  EXPECT_FALSE(std::get<bool>((*parsed)[3].value));
  EXPECT_EQ(std::get<std::string>((*parsed)[4].value), "hello");
  EXPECT_EQ(std::get<int64_t>((*parsed)[5].value), -7);
}

TEST(OptionsTest, PoolOptionsFoldIntoTheStaticPdPolicy) {
  auto options = ParseOptions({{"policy", std::string("static-pd")},
                               {"prefill_devices", std::string("0,1")},
                               {"decode_devices", std::string("2,3")}},
                              FakeEnv({}));
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(EffectivePolicy(*options), "static-pd:prefill=0,1|decode=2,3");
  auto plain = ParseOptions({{"policy", std::string("dynamic")}}, FakeEnv({}));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(EffectivePolicy(*plain), "dynamic");
}

TEST(OptionsTest, UserCpuDeviceCountIsKept) {
  auto options = ParseOptions({{"backend_options", std::string("cpu_device_count=2")}},
                              FakeEnv({}));
  ASSERT_TRUE(options.ok());
  auto backend = EffectiveBackendOptions(*options);
  ASSERT_EQ(backend.size(), 1u);
  EXPECT_EQ(std::get<int64_t>(backend[0].value), 2);
}

struct BadCase {
  std::vector<NamedOption> options;
  std::map<std::string, std::string> env;
  std::string message;
};

TEST(OptionsTest, BadOptionsNameTheProblem) {
  const std::vector<BadCase> cases = {
      {{{"num_virtual_device", int64_t{2}}}, {}, "unknown FlexNPU create option 'num_virtual_device'"},
      {{{"num_virtual_devices", std::string("x")}}, {}, "must be an integer, got 'x'"},
      {{{"num_virtual_devices", int64_t{-1}}}, {}, "must be in [1, 65536], got -1"},
      {{{"num_virtual_devices", true}}, {}, "'num_virtual_devices' must be an integer"},
      {{{"policy", int64_t{2}}}, {}, "'policy' must be a string"},
      {{{"single_device_compile", std::string("eager")}}, {}, "got 'eager'"},
      {{{"share_compiles", std::string("sometimes")}}, {}, "'share_compiles' must be a boolean"},
      {{{"backend", int64_t{1}}}, {}, "'backend' must be a string"},
      {{{"backend", std::string("  ")}}, {}, "'backend' is empty"},
      {{}, {{"FLEXNPU_BACKEND_OPTIONS", "a=1;=2"}}, "malformed backend option '=2'"},
      {{}, {{"FLEXNPU_BACKEND_OPTIONS", "a=1;a=2"}}, "backend option 'a' given twice"},
      {{}, {{"FLEXNPU_NUM_VIRTUAL_DEVICES", "4x"}}, "must be an integer, got '4x'"},
  };
  for (const auto& c : cases) {
    auto options = ParseOptions(c.options, FakeEnv(c.env));
    ASSERT_FALSE(options.ok()) << c.message;
    EXPECT_EQ(options.status().code(), Code::kInvalidArgument);
    EXPECT_NE(options.status().message().find(c.message), std::string::npos)
        << options.status().message();
  }
}

}  // namespace
}  // namespace flexnpu
