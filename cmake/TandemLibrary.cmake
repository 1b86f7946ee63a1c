# Include scopes: the build lets a file include a header only if the header belongs to the file's
# own target or to a target it links (through PUBLIC links, transitively). Includes stay
# root-relative ("engine/kv/kv_cache.h"); there is no include path to the source root.
#
# Each target that owns headers gets a folder ${CMAKE_BINARY_DIR}/include_scopes/<target> that
# mirrors the source tree with one symbolic link per header it owns, and that folder goes on the
# target's include path (PUBLIC for a library, so its dependents see it). A header missing from
# every scope on a file's include path does not exist for that file: a wrong include fails with
# "No such file or directory". Compiler messages name headers by their path in the scope.

# tandem_include_scope(<target> <PUBLIC|PRIVATE|INTERFACE> [OWNER] [DIRS dir...] [HEADERS file...])
# Gives <target> the headers directly in each of DIRS (*.h and *.cuh, not those of subfolders)
# and each of HEADERS; every path is relative to the source root. The globs are re-checked at
# each build, so an added or removed header needs no manual re-configure. OWNER: <target> owns
# these headers, and a header has one owner (two claims are a configure error); test binaries
# see the headers beside their sources without owning them.
function(tandem_include_scope target visibility)
  cmake_parse_arguments(S "OWNER" "" "DIRS;HEADERS" ${ARGN})
  set(scope ${CMAKE_BINARY_DIR}/include_scopes/${target})
  set(headers ${S_HEADERS})
  foreach(dir ${S_DIRS})
    if(NOT IS_DIRECTORY ${CMAKE_SOURCE_DIR}/${dir})
      message(FATAL_ERROR "${target}: include scope folder ${dir} does not exist")
    endif()
    file(GLOB found CONFIGURE_DEPENDS RELATIVE ${CMAKE_SOURCE_DIR}
         ${CMAKE_SOURCE_DIR}/${dir}/*.h ${CMAKE_SOURCE_DIR}/${dir}/*.cuh)
    list(APPEND headers ${found})
  endforeach()
  # Links left by an earlier configure (a header since deleted, moved, or given to another
  # target) would keep a wrong include compiling: remove them.
  file(GLOB_RECURSE old RELATIVE ${scope} LIST_DIRECTORIES false ${scope}/*)
  foreach(header ${old})
    if(NOT header IN_LIST headers)
      file(REMOVE ${scope}/${header})
    endif()
  endforeach()
  foreach(header ${headers})
    if(NOT EXISTS ${CMAKE_SOURCE_DIR}/${header})
      message(FATAL_ERROR "${target}: header ${header} does not exist")
    endif()
    if(S_OWNER)
      get_property(owner GLOBAL PROPERTY "TANDEM_HEADER_OWNER:${header}")
      if(owner)
        message(FATAL_ERROR "${header} is claimed by both ${owner} and ${target}")
      endif()
      set_property(GLOBAL PROPERTY "TANDEM_HEADER_OWNER:${header}" ${target})
    endif()
    get_filename_component(dir ${scope}/${header} DIRECTORY)
    file(MAKE_DIRECTORY ${dir})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${header} ${scope}/${header} SYMBOLIC)
  endforeach()
  target_include_directories(${target} ${visibility} ${scope})
endfunction()

# tandem_library(NAME name [DIRS dir...] [HEADERS file...] [SRCS src...])
# add_library(name SRCS) (an INTERFACE library when SRCS is empty) that owns the headers of DIRS
# and HEADERS, on its PUBLIC include scope (see tandem_include_scope). Link dependencies with
# target_link_libraries as usual: PUBLIC for those whose headers the library's headers include.
function(tandem_library)
  cmake_parse_arguments(L "" "NAME" "DIRS;HEADERS;SRCS" ${ARGN})
  if(L_SRCS)
    add_library(${L_NAME} ${L_SRCS})
    tandem_include_scope(${L_NAME} PUBLIC OWNER DIRS ${L_DIRS} HEADERS ${L_HEADERS})
  else()
    add_library(${L_NAME} INTERFACE)
    tandem_include_scope(${L_NAME} INTERFACE OWNER DIRS ${L_DIRS} HEADERS ${L_HEADERS})
  endif()
endfunction()
