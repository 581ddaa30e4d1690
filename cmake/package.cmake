# The installable parts of memento (docs/python.md, "Packaging"):
#   libmemento.so     the public C++ API (include/memento/*.h) as one shared
#                     library; the layers are static archives linked whole
#   cmake --install   headers, the library, the `memento` tool, a CMake
#                     package (find_package(memento) -> memento::memento)
#                     and a pkg-config file (memento.pc)
# Exercised by tests/packaging (packaging_install_test).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(memento_shared SHARED ${PROJECT_SOURCE_DIR}/src/client/shared_lib.cc)
add_library(memento::memento ALIAS memento_shared)
set_target_properties(memento_shared PROPERTIES
  OUTPUT_NAME memento
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME memento)
target_include_directories(memento_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(memento_shared PUBLIC cxx_std_17)
# Every object of the client and of the vocabulary layer (Status, dtypes)
# goes in, whether or not the client itself calls it; the rest of the layers
# contribute what the client needs. --no-undefined: a missing dependency is
# a link error here, not in a user's program.
target_link_libraries(memento_shared PRIVATE
  -Wl,--whole-archive $<TARGET_FILE:memento_client> $<TARGET_FILE:memento_common>
  -Wl,--no-whole-archive
  memento_client memento_common)
if(NOT MEMENTO_SANITIZE)  # sanitizer runtimes come from the executable
  target_link_options(memento_shared PRIVATE -Wl,--no-undefined)
endif()
add_dependencies(memento_shared memento_client memento_common)

set_target_properties(memento PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

install(TARGETS memento_shared EXPORT mementoTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS memento RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/memento
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT mementoTargets NAMESPACE memento::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/memento)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mementoConfig.cmake.in
  ${PROJECT_BINARY_DIR}/generated/mementoConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/memento)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/generated/mementoConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/generated/mementoConfig.cmake
  ${PROJECT_BINARY_DIR}/generated/mementoConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/memento)
# The .pc file finds its prefix from its own place (${pcfiledir}), so an
# installed tree can be moved (cmake --install --prefix DIR included).
file(RELATIVE_PATH MEMENTO_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
configure_file(${PROJECT_SOURCE_DIR}/cmake/memento.pc.in
  ${PROJECT_BINARY_DIR}/generated/memento.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/generated/memento.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
