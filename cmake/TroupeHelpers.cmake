# troupe_test(NAME SOURCES <files...> DEPS <targets...> [LABELS <labels...>] [TIMEOUT <s>])
# One GoogleTest binary; each TEST becomes its own ctest entry.
# troupe_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s] [STRICT_DEVICE_CASES]):
# a GoogleTest binary, its cases discovered as ctest tests. STRICT_DEVICE_CASES
# labels the cases whose names contain "Strict" strict_device (ctest -L
# strict_device runs everything proven on the strict CPU device).
function(troupe_test name)
  cmake_parse_arguments(ARG "STRICT_DEVICE_CASES" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set(properties TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    list(APPEND properties LABELS "${ARG_LABELS}")
  endif()
  if(ARG_STRICT_DEVICE_CASES)
    gtest_discover_tests(${name}
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      DISCOVERY_TIMEOUT 60
      TEST_FILTER "*Strict*"
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "strict_device;${ARG_LABELS}")
    gtest_discover_tests(${name}
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      DISCOVERY_TIMEOUT 60
      TEST_FILTER "-*Strict*"
      PROPERTIES ${properties})
  else()
    gtest_discover_tests(${name}
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      DISCOVERY_TIMEOUT 60
      PROPERTIES ${properties})
  endif()
endfunction()
