'use strict'
const helper = require('./../test-helper')

module.exports = helper
