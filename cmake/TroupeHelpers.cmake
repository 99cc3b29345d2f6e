# troupe_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s] [STRICT_DEVICE_CASES] [PJRT_CASES] [PJRT]):
# a GoogleTest binary, its cases discovered as ctest tests; nothing when
# TROUPE_TESTS is off (callers that add to the target do so under if(TROUPE_TESTS)).
#  - STRICT_DEVICE_CASES labels the cases whose names contain "Strict"
#    strict_device (ctest -L strict_device runs everything proven on the
#    strict CPU device).
#  - PJRT_CASES: the cases whose names contain "Pjrt" run on a PJRT CPU plugin
#    (label pjrt, after the fixture that fetches it; TROUPE_PJRT_PLUGIN names
#    it); PJRT: the whole binary does, its ctest names prefixed "Pjrt." (a
#    suite built twice, as nn_ops_test is, keeps distinct names).
function(troupe_test name)
  if(NOT TROUPE_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "STRICT_DEVICE_CASES;PJRT_CASES;PJRT" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  # Cases on PJRT may read the backend's counters (executions, compiles).
  if((ARG_PJRT_CASES OR ARG_PJRT) AND TARGET troupe_pjrt)
    target_link_libraries(${name} PRIVATE troupe_pjrt)
    target_compile_definitions(${name} PRIVATE TROUPE_HAVE_PJRT=1)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set(pjrt_properties FIXTURES_REQUIRED pjrt_plugin ENVIRONMENT "TROUPE_PJRT_PLUGIN=${TROUPE_PJRT_CPU_PLUGIN}")
  if(ARG_PJRT)
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60 TEST_PREFIX "Pjrt."
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "pjrt;${ARG_LABELS}" ${pjrt_properties})
    return()
  endif()
  # The cases left for the plain group: all but those split off below.
  set(others "")
  if(ARG_PJRT_CASES)
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60
      TEST_FILTER "*Pjrt*"
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "pjrt;${ARG_LABELS}" ${pjrt_properties})
    list(APPEND others "*Pjrt*")
  endif()
  if(ARG_STRICT_DEVICE_CASES)
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60
      TEST_FILTER "*Strict*-*Pjrt*"
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "strict_device;${ARG_LABELS}")
    list(APPEND others "*Strict*")
  endif()
  set(properties TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    list(APPEND properties LABELS "${ARG_LABELS}")
  endif()
  if(others)
    list(JOIN others ":" excluded)
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60
      TEST_FILTER "-${excluded}" PROPERTIES ${properties})
  else()
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60
      PROPERTIES ${properties})
  endif()
endfunction()

# troupe_link_closure(OUT TARGET...): the TARGETs and every troupe (not
# imported) library they link, directly or through another: what export()
# needs to export them. OUT is set in the caller.
function(troupe_link_closure out)
  set(closure "")
  set(pending ${ARGN})
  while(pending)
    list(POP_FRONT pending target)
    # A static library's private dependencies appear as $<LINK_ONLY:NAME>.
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.+)>$" "\\1" target "${target}")
    if(target IN_LIST closure OR NOT TARGET "${target}")
      continue()
    endif()
    get_target_property(imported ${target} IMPORTED)
    if(imported)
      continue()
    endif()
    list(APPEND closure ${target})
    foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(libraries ${target} ${property})
      if(libraries)
        list(APPEND pending ${libraries})
      endif()
    endforeach()
  endwhile()
  set(${out} ${closure} PARENT_SCOPE)
endfunction()
