"""Loss functions and the table updates and rankings they rest on."""
