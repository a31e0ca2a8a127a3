# the python kernel lands here
