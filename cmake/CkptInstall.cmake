# Installs libckpt: headers, library, CMake package (ckpt::ckpt) and pkg-config file.
include(CMakePackageConfigHelpers)
install(TARGETS ckpt EXPORT ckptTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/libckpt/include/ckpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/libckpt/include/ckpt/config.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ckpt)
install(EXPORT ckptTargets NAMESPACE ckpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ckpt)
if(TARGET ckpt_mpi)
  install(EXPORT ckptMpiTargets NAMESPACE ckpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ckpt)
endif()
foreach(_gpu cuda nccl)
  if(TARGET ckpt_${_gpu})
    install(EXPORT ckpt${_gpu}Targets NAMESPACE ckpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ckpt)
  endif()
endforeach()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ckptConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ckptConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ckpt)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ckptConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ckptConfig.cmake ${PROJECT_BINARY_DIR}/ckptConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ckpt)
# Relocatable: the prefix is found relative to the .pc file itself.
file(RELATIVE_PATH CKPT_PC_TO_PREFIX /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
# A static libckpt: `pkg-config --static --libs ckpt` brings what it links.
set(CKPT_PC_PRIVATE "")
if(NOT BUILD_SHARED_LIBS)
  # libcurl by -lcurl: its .pc's --static list names the static libraries of curl's own
  # dependencies, which a shared libcurl does not need (and Debian does not install).
  set(_ckpt_pc_requires "hdf5 libzstd libxxhash")
  set(_ckpt_pc_libs "-pthread")
  if(CKPT_HAVE_S3)
    string(APPEND _ckpt_pc_requires " libcrypto")
    set(_ckpt_pc_libs "-lcurl -pthread")
  endif()
  set(CKPT_PC_PRIVATE "Requires.private: ${_ckpt_pc_requires}\nLibs.private: ${_ckpt_pc_libs}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/ckpt.pc.in ${PROJECT_BINARY_DIR}/ckpt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
