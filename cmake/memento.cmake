# Helpers shared by every layer's CMakeLists.txt.
#
#   memento_library(NAME memento_shm SOURCES a.cc b.cc DEPS memento_common ...)
#     A static library for one layer. Public include roots: include/, src/ and the
#     generated config directory, so code includes "memento/status.h" or
#     "shm/slot.h" (layer-relative paths).
#
#   memento_test(NAME shm_slot_test SOURCES slot_test.cc DEPS memento_shm [LABELS unit])
#     A GoogleTest binary registered with CTest (one CTest entry per binary, so a
#     crashing test names its binary).
#     TIMEOUT (default 300 s) is multiplied by MEMENTO_TEST_TIMEOUT_SCALE.

# Sanitized builds run several times slower: agent_sharded_exhaustive_test took
# 438 s under AddressSanitizer at load 25 against its 300 s limit (docs/testing.md,
# "Sanitizer runs of record"), so there every test's limit is tripled.
if(MEMENTO_SANITIZE)
  set(MEMENTO_TEST_TIMEOUT_SCALE 3)
else()
  set(MEMENTO_TEST_TIMEOUT_SCALE 1)
endif()

function(memento_library)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SOURCES})
  target_include_directories(${ARG_NAME} PUBLIC
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${PROJECT_BINARY_DIR}/generated)
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

function(memento_test)
  if(NOT MEMENTO_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * ${MEMENTO_TEST_TIMEOUT_SCALE}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    ENVIRONMENT "MEMENTO_TEST_TMPDIR=${PROJECT_BINARY_DIR}/test-tmp")
endfunction()
