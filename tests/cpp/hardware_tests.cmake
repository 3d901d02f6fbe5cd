# The hardware layer's tests (included from CMakeLists.txt here): they load the fake vendor
# libraries built from tests/fakes, found through FLEXNPU_FAKES_DIR.
add_subdirectory(${PROJECT_SOURCE_DIR}/tests/fakes ${CMAKE_CURRENT_BINARY_DIR}/fakes)
file(GLOB FLEXNPU_HARDWARE_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/hardware_*_test.cc)
foreach(source ${FLEXNPU_HARDWARE_TESTS})
  get_filename_component(name ${source} NAME_WE)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE flexnpu_hardware GTest::gtest_main ${CMAKE_DL_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE FLEXNPU_FAKES_DIR="${FLEXNPU_FAKES_DIR}")
  add_dependencies(${name} flexnpu_fakes)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60)
endforeach()
