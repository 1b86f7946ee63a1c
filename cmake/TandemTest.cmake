# tandem_add_test(NAME name SRCS a.cc b.cc DEPS lib... [LABELS gpu ...] [TIMEOUT s] [RUN_SERIAL])
# The test sees the headers of what it links (DEPS) and those beside its own sources
# (tests/<folder>/*.h); a helper header another folder's tests use belongs to a test library.
# RUN_SERIAL: ctest -j runs the test alone (tests whose timing checks must not share 2 cores
# with the end-to-end tests' many processes).
# One GoogleTest binary per call, registered with CTest (gtest_discover_tests would run every
# binary at build time; one CTest entry per binary keeps the 2-core build fast).
find_package(GTest REQUIRED)

function(tandem_add_test)
  cmake_parse_arguments(T "RUN_SERIAL" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  set(dirs)
  foreach(src ${T_SRCS})
    get_filename_component(dir ${CMAKE_CURRENT_SOURCE_DIR}/${src} DIRECTORY)
    file(RELATIVE_PATH dir ${CMAKE_SOURCE_DIR} ${dir})
    list(APPEND dirs ${dir})
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  tandem_include_scope(${T_NAME} PRIVATE DIRS ${dirs})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  if(NOT T_LABELS)
    set(T_LABELS cpu)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       ENVIRONMENT "TANDEM_SOURCE_DIR=${CMAKE_SOURCE_DIR};TANDEM_BINARY_DIR=${CMAKE_BINARY_DIR}")
  if(T_RUN_SERIAL)
    set_tests_properties(${T_NAME} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()
