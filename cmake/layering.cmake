# The layering of docs/architecture.md, checked (issue 14).
#
# MEMENTO_LAYER_ALLOWED_<layer>: the layers a layer's non-test sources may
# include ("#include \"<layer>/...\"") and its library may link
# (memento_<layer>). Lower layers never use higher ones.
#
# Used two ways:
#   include(cmake/layering.cmake) then memento_check_layer_links(): at configure
#     time, every memento_<layer> library's target_link_libraries against the
#     table (FATAL_ERROR naming the library and the link);
#   cmake -DMEMENTO_SOURCE_DIR=<repo> -P cmake/layering.cmake: scans every
#     non-test source under src/ for includes of a layer it may not use
#     (the `layering_test` CTest entry; exit status 1 naming file and line).

set(MEMENTO_LAYERS common topo model codec shm net coord tier opt snap recover client toy agent launch)
set(MEMENTO_LAYER_ALLOWED_common "")
set(MEMENTO_LAYER_ALLOWED_topo common)
set(MEMENTO_LAYER_ALLOWED_model topo common)
set(MEMENTO_LAYER_ALLOWED_codec common)
set(MEMENTO_LAYER_ALLOWED_shm common)
set(MEMENTO_LAYER_ALLOWED_net common)
set(MEMENTO_LAYER_ALLOWED_coord net common)
set(MEMENTO_LAYER_ALLOWED_tier common)
set(MEMENTO_LAYER_ALLOWED_opt common)
set(MEMENTO_LAYER_ALLOWED_snap shm common)
set(MEMENTO_LAYER_ALLOWED_recover topo codec shm common)
set(MEMENTO_LAYER_ALLOWED_client snap shm codec common)
set(MEMENTO_LAYER_ALLOWED_toy client shm common)
set(MEMENTO_LAYER_ALLOWED_agent recover coord net tier topo model codec shm opt common)
set(MEMENTO_LAYER_ALLOWED_launch recover coord tier topo model shm net common)
# Single headers a layer may include from a layer it may not use, as
# "<layer>:<header>": none (the peer method numbers and the T1 file layout the
# launcher needs live in net/ and shm/, below agent and launch; issue 14).
set(MEMENTO_LAYER_HEADER_EXCEPTIONS "")

# Libraries of a layer other than memento_<layer> itself.
set(MEMENTO_LAYER_EXTRA_LIBS_snap memento_has memento_has_bench memento_cuda_engine memento_cuda_copy)
set(MEMENTO_LAYER_EXTRA_LIBS_codec memento_codec_reference)

function(_memento_layer_of_lib lib out)
  set(result "")
  foreach(layer ${MEMENTO_LAYERS})
    if(lib STREQUAL "memento_${layer}")
      set(result ${layer})
    endif()
    foreach(extra ${MEMENTO_LAYER_EXTRA_LIBS_${layer}})
      if(lib STREQUAL extra)
        set(result ${layer})
      endif()
    endforeach()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

function(memento_check_layer_links)
  foreach(layer ${MEMENTO_LAYERS})
    foreach(lib memento_${layer} ${MEMENTO_LAYER_EXTRA_LIBS_${layer}})
      if(NOT TARGET ${lib})
        continue()
      endif()
      get_target_property(links ${lib} LINK_LIBRARIES)
      if(NOT links)
        continue()
      endif()
      foreach(dep ${links})
        _memento_layer_of_lib("${dep}" dep_layer)
        if(dep_layer STREQUAL "" OR dep_layer STREQUAL layer)
          continue()
        endif()
        list(FIND MEMENTO_LAYER_ALLOWED_${layer} ${dep_layer} at)
        if(at LESS 0)
          message(FATAL_ERROR
            "layering: ${lib} (layer ${layer}) links ${dep} (layer ${dep_layer}); "
            "${layer} may use only: ${MEMENTO_LAYER_ALLOWED_${layer}} (docs/architecture.md)")
        endif()
      endforeach()
    endforeach()
  endforeach()
endfunction()

# Script mode: the include scan.
if(CMAKE_SCRIPT_MODE_FILE AND MEMENTO_SOURCE_DIR)
  set(bad 0)
  foreach(layer ${MEMENTO_LAYERS})
    file(GLOB_RECURSE files "${MEMENTO_SOURCE_DIR}/src/${layer}/*.h"
         "${MEMENTO_SOURCE_DIR}/src/${layer}/*.cc" "${MEMENTO_SOURCE_DIR}/src/${layer}/*.cu")
    foreach(f ${files})
      get_filename_component(name ${f} NAME)
      if(name MATCHES "_test\\.(cc|h)$" OR name MATCHES "test_util" OR name MATCHES "_test_")
        continue()
      endif()
      file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"[a-z_]+/")
      foreach(line ${lines})
        string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([a-z_]+)/([^\"]*)\".*" "\\1" dep "${line}")
        string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([a-z_]+/[^\"]*)\".*" "\\1" header "${line}")
        list(FIND MEMENTO_LAYERS ${dep} is_layer)
        if(is_layer LESS 0 OR dep STREQUAL layer)
          continue()
        endif()
        list(FIND MEMENTO_LAYER_ALLOWED_${layer} ${dep} at)
        list(FIND MEMENTO_LAYER_HEADER_EXCEPTIONS "${layer}:${header}" excepted)
        if(at LESS 0 AND excepted LESS 0)
          file(RELATIVE_PATH rel ${MEMENTO_SOURCE_DIR} ${f})
          message("layering: ${rel} (layer ${layer}) includes \"${header}\" (layer ${dep}); "
                  "${layer} may use only: ${MEMENTO_LAYER_ALLOWED_${layer}}")
          set(bad 1)
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(bad)
    message(FATAL_ERROR "layering: upward or sideways includes found (docs/architecture.md)")
  endif()
  message("layering: every layer includes only the layers below it")
endif()
