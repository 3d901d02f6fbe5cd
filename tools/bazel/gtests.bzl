"""One cc_test per *_test.cc of a package, GoogleTest style, shared by tests/cpp and
xla_passes/tests. Other .h/.cc files of the package form a `test_support` library linked into
every test; files under data/ are test data, found at FLEXNPU_TEST_DATA_DIR (a macro, as in
CMake; relative to the test's working directory, the runfiles root)."""

def flexnpu_gtests(deps, exclude = []):
    native.cc_library(
        name = "test_support",
        testonly = True,
        srcs = native.glob(["*.cc"], exclude = ["*_test.cc"]),
        hdrs = native.glob(["*.h"]),
        deps = deps + ["@com_google_googletest//:gtest"],
    )

    # Defines are shell-tokenized: the escaped quotes make the macro a string literal.
    data_dir_define = 'FLEXNPU_TEST_DATA_DIR=\\"%s/data\\"' % native.package_name()
    for src in native.glob(["*_test.cc"], exclude = exclude):
        native.cc_test(
            name = src[:-len(".cc")],
            size = "small",
            srcs = [src],
            data = native.glob(["data/**"]),
            local_defines = [data_dir_define],
            deps = [":test_support"] + deps + ["@com_google_googletest//:gtest_main"],
        )
