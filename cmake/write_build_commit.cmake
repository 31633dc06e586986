# Writes OUT (a header defining SF_GIT_DESCRIBE) from `git describe` of SRC, rewriting it only
# when the text changes, so an unchanged commit rebuilds nothing. Run at every build by the
# sf_build_commit target (src/CMakeLists.txt): a model card names the commit it was built from.
execute_process(COMMAND git describe --always --dirty --abbrev=12
                WORKING_DIRECTORY ${SRC} OUTPUT_VARIABLE describe
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT describe)
  set(describe unknown)
endif()
set(text "#define SF_GIT_DESCRIBE \"${describe}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
