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
#    XLA compiles every PJRT case's programs without LLVM's optimisation
#    (XLA_FLAGS --xla_backend_optimization_level=0: a third of the compile
#    time, and the tests' small steps run no slower for it; XLA's HLO passes
#    still run). What they test is troupe's lowering, not XLA's code
#    generation; a run, the benchmarks and the lease compile optimised.
#  - The fast tier: every case outside the PJRT group is labelled fast
#    (ctest -L fast: the unit tests; docs/development.md says how long)
#    unless cmake/SlowTests.cmake lists it, or the binary is SLOW (it starts
#    processes, trains, or waits on a network).
include(SlowTests)
# troupe_discover_group(TARGET INCLUDE EXCLUDE LABELS TIMEOUT): the cases of
# TARGET matching one of the INCLUDE gtest patterns and none of EXCLUDE, as
# ctest tests with LABELS (empty entries dropped); nothing when INCLUDE is
# empty.
function(troupe_discover_group name include exclude labels timeout)
  if(NOT include)
    return()
  endif()
  list(JOIN include ":" filter)
  if(exclude)
    list(JOIN exclude ":" excluded)
    string(APPEND filter "-${excluded}")
  endif()
  list(REMOVE_ITEM labels "")
  set(properties TIMEOUT ${timeout})
  if(labels)
    list(APPEND properties LABELS "${labels}")
  endif()
  gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60
    TEST_FILTER "${filter}" PROPERTIES ${properties})
endfunction()

# troupe_test_paths(TARGET NAME PATH [NAME PATH ...]): each NAME a macro in
# TARGET's objects giving PATH (absolute; generator expressions allowed) as
# a std::string, resolved beside the running binary (common/build_tree.h,
# which the sources using NAME include): the definition holds PATH relative
# to TARGET's folder, the same text in every checkout, so that ccache serves
# the object to a fresh clone's build (an absolute path in a -D would make
# it compile anew in each).
function(troupe_test_paths target)
  set(args ${ARGN})
  while(args)
    list(POP_FRONT args name path)
    target_compile_definitions(${target} PRIVATE
      "${name}=::troupe::BesideThisBinary(\"$<PATH:RELATIVE_PATH,${path},$<TARGET_FILE_DIR:${target}>>\")")
  endwhile()
endfunction()

# A test that runs `mpiexec -np RANKS` on the command after TIMEOUT (root
# needs --allow-run-as-root; RANKS slots on a small machine --oversubscribe;
# Open MPI's shared-memory transport between the ranks).
function(troupe_mpi_test name ranks timeout)
  add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} -np ${ranks} --oversubscribe --allow-run-as-root ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout}
                       ENVIRONMENT "OMPI_MCA_btl=self,vader;OMPI_MCA_rmaps_base_oversubscribe=1")
endfunction()

function(troupe_test name)
  if(NOT TROUPE_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "STRICT_DEVICE_CASES;PJRT_CASES;PJRT;SLOW" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock troupe_test_main)
  # A test's own file (cases, fixtures, references) at -O1 in Release: it
  # compiles about a third faster than at -O3, and what it tests, the
  # libraries, stays -O3 -march=native.
  target_compile_options(${name} PRIVATE $<$<CONFIG:Release>:-O1>)
  # One source at a time: a test's helpers are file-local and often share
  # names with a neighbour's (the libraries are built in unity batches).
  # The common headers come precompiled (troupe_test_pch, CMakeLists.txt).
  set_target_properties(${name} PROPERTIES UNITY_BUILD OFF)
  # (-pthread: the PCH's, which GCC requires of every user; most tests have it from their libraries.)
  target_precompile_headers(${name} REUSE_FROM troupe_test_pch)
  target_compile_options(${name} PRIVATE -pthread)
  # Cases on PJRT may read the backend's counters (executions, compiles).
  if((ARG_PJRT_CASES OR ARG_PJRT) AND TARGET troupe_pjrt)
    target_link_libraries(${name} PRIVATE troupe_pjrt)
    target_compile_definitions(${name} PRIVATE TROUPE_HAVE_PJRT=1)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set(pjrt_properties FIXTURES_REQUIRED pjrt_plugin ENVIRONMENT "TROUPE_PJRT_PLUGIN=${TROUPE_PJRT_CPU_PLUGIN}"
      ENVIRONMENT_MODIFICATION "XLA_FLAGS=set:--xla_backend_optimization_level=0")
  if(ARG_PJRT)
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60 TEST_PREFIX "Pjrt."
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "pjrt;${ARG_LABELS}" ${pjrt_properties})
    return()
  endif()
  # The cases left for the plain group: all but those split off below.
  set(others "")
  if(ARG_PJRT_CASES)
    gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60 TEST_FILTER "*Pjrt*"
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "pjrt;${ARG_LABELS}" ${pjrt_properties})
    list(APPEND others "*Pjrt*")
  endif()
  # The fast tier: the cases cmake/SlowTests.cmake lists go to groups of
  # their own, unlabelled fast (a pattern naming "Strict" keeps a strict
  # case's strict_device label; other patterns leave strict cases alone).
  set(fast "fast")
  set(strict_others ${others})
  if(ARG_SLOW)
    set(fast "")
  else()
    set(slow_strict "")
    set(slow_plain "")
    foreach(pattern IN LISTS TROUPE_SLOW_TESTS)
      if(ARG_STRICT_DEVICE_CASES AND pattern MATCHES "Strict")
        list(APPEND slow_strict "${pattern}")
      else()
        list(APPEND slow_plain "${pattern}")
      endif()
    endforeach()
    troupe_discover_group(${name} "${slow_strict}" "${others}" "strict_device;${ARG_LABELS}" ${ARG_TIMEOUT})
    list(APPEND strict_others ${slow_strict})
    list(APPEND others ${slow_strict})
    if(ARG_STRICT_DEVICE_CASES)
      list(APPEND others "*Strict*")
    endif()
    troupe_discover_group(${name} "${slow_plain}" "${others}" "${ARG_LABELS}" ${ARG_TIMEOUT})
    list(APPEND others ${slow_plain})
  endif()
  if(ARG_STRICT_DEVICE_CASES)
    troupe_discover_group(${name} "*Strict*" "${strict_others}" "strict_device;${fast};${ARG_LABELS}" ${ARG_TIMEOUT})
    list(APPEND others "*Strict*")
  endif()
  troupe_discover_group(${name} "*" "${others}" "${fast};${ARG_LABELS}" ${ARG_TIMEOUT})
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

# troupe_program(TARGET): one of troupe's programs that runs a learner
# (troupe, the benchmarks' programs; not a library, and not the env worker,
# which the Python module's wheel carries to machines without tcmalloc: a
# module keeps its interpreter's malloc), linked with tcmalloc where
# TROUPE_TCMALLOC (CMakeLists.txt), which then serves every malloc of the
# process, the PJRT plugin's too. The program calls none of its functions:
# --no-as-needed keeps it where a linker drops unreferenced libraries
# (`troupe --version`, common/allocator.h Allocator, says which malloc a
# process got). And common/program.cc, what such a process sets up before
# main (absl::Mutex's deadlock detector off where optimized).
function(troupe_program target)
  target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/common/program.cc)
  target_link_libraries(${target} PRIVATE absl::synchronization)
  if(TROUPE_TCMALLOC)
    target_link_options(${target} PRIVATE "LINKER:--no-as-needed")
    target_link_libraries(${target} PRIVATE PkgConfig::TCMALLOC)
  endif()
endfunction()
